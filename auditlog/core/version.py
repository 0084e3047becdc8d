"""The package version, in a module that imports nothing (metadata and the CLI read it)."""

__version__ = "0.1.0"
