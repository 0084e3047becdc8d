"""Archives of runs kept outside the store: ``write`` (``auditlog export``) makes one, plain
Parquet and JSON any engine reads; ``check`` (``auditlog verify --archive``) verifies one
from its files alone. Above ``read`` (an export lists the store's runs), beside ``ui``."""
