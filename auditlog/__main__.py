"""``python -m auditlog``: the ``auditlog`` command (also ``torchrun -m auditlog run train.py``)."""

from __future__ import annotations

from auditlog.cli.main import main

if __name__ == "__main__":
    main()
