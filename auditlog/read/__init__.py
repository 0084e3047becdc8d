"""Read: the Python API over a store (``auditlog.open``), run selection, diffs.

Everything a reader asks goes through ``auditlog.store`` methods; nothing here
writes the record.
"""
