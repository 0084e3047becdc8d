"""Recording: one recording of a process (``auditlog.record()`` and ``auditlog run``).

The session opens the store, starts the writer thread and installs the capture
layer's hooks; the writer encodes, chains and stores what the hooks queue. Run
metadata, crash detection of earlier runs and running a script as ``__main__``
live here too.
"""
