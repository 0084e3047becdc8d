"""What the capture layer hands the writer: the records on the buffer, by type.

- ``EventRecord``: one event, ``(kind, ts_ns, step, module_id, tensor_id,
  payload)``. A plain tuple, typed: building a named tuple per event costs about
  six times a tuple literal, on the training thread, for every event; the writer
  unpacks it in one place (``Writer._encode``). ``payload`` is a dict, a
  ``core.chain.Clean`` (encoded without a walk) or a lazy value the writer
  resolves off the training thread (``capture.payloads``).
- ``registrations.Registrations``: a batch of deferred registrations, in hook
  order; the writer expands it into events.
- ``Flush``: the writer signals ``done`` once everything queued before it is
  written (or dropped).

The writer dispatches on the record's type; nothing on the buffer is told apart
by a string.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from auditlog.capture.registrations import Registrations

EventRecord = tuple[str, int, int | None, int | None, int | None, Any]


@dataclass(frozen=True, slots=True)
class Flush:
    """Signal ``done`` once every record queued before this one is written."""

    done: threading.Event


Record = EventRecord | Registrations | Flush
