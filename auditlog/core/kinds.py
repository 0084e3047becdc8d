"""Every event kind, defined once: what it records, each payload field's type and meaning,
and the line ``auditlog events`` shows for it.

These tables are the single source of truth for what an event payload holds. Derived
from it: the event reference (``docs/events.md``, ``make docs``: ``cli/reference.py``), which fields
readers decode from their packed form (``store/rows.py``, the read model's
vectors), the summaries of ``auditlog events`` (``cli/summaries.py``), and the
test that checks every payload a real recording emits against it, types included
(``tests/test_kinds.py``). Adding a field is one entry here (and what emits it);
the types are those of ``core.eventtypes``, as the payload is stored (packed
vectors as ``F32`` / ``INTS``). The columns of the event row are ``core.eventrow``.

The kinds are defined by subject in ``kinds_model``, ``kinds_training`` and
``kinds_data`` (shared field types in ``kindfields``), plus the two below;
``KINDS`` holds them all, in the order of the event reference.
"""

from __future__ import annotations

from auditlog.core.eventtypes import (
    OBJ,
    STR,
    F,
    Kind,
)
from auditlog.core.kinds_data import DATA_KINDS
from auditlog.core.kinds_model import MODEL_KINDS
from auditlog.core.kinds_training import TRAINING_KINDS

_KINDS = [
    *MODEL_KINDS,
    *TRAINING_KINDS,
    *DATA_KINDS,
    Kind(
        "annotation",
        "A fact the user added with run.annotate(key, **fields).",
        {
            "key": F(STR, "the annotation key"),
            "fields": F(OBJ, "the user's fields (JSON-encodable)"),
        },
        summary=((None, "{key}: {fields}"),),
    ),
    Kind(
        "recorder_error",
        "The recorder itself failed somewhere; training went on. Part of the record.",
        {
            "where": F(STR, "hook or component that failed"),
            "type": F(STR, "exception type"),
            "message": F(STR, "exception message"),
        },
        summary=((None, "{where}: {type}: {message}"),),
    ),
]

KINDS: dict[str, Kind] = {k.name: k for k in _KINDS}
