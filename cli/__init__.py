"""The ``auditlog`` command line (installed as ``auditlog.cli``); thin over the library."""
