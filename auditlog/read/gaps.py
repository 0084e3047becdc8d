"""What a run's record says it does not hold: work that ran where no hook saw it.

The report's outcome, the web UI's run page and the documentation facts (``bom``,
the EU AI Act headings) word these gaps the same way, from the run's event counts
and its ``run_ended`` payload (docs/hooks.md says where each comes from).
"""

from __future__ import annotations

from typing import Any


def record_gaps(kinds: dict[str, int], ended: dict[str, Any]) -> list[str]:
    """The gaps of a run's record, one sentence each (empty when there is none).
    ``kinds``: the run's event counts by kind; ``ended``: its ``run_ended`` payload."""
    gaps = []
    frames = ended.get("compiled_frames")
    if isinstance(frames, int) and not isinstance(frames, bool) and frames > 0:
        gaps.append(
            f"torch.compile compiled {frames} frame(s) during the run: module calls, backward "
            "passes and optimizer steps inside compiled code are not in the record"
        )
    if kinds.get("untracked_updates"):
        gaps.append(
            "parameters were updated where no optimizer step hook saw it (a step inside "
            "torch.compile, or an update by hand): those updates are not counted as steps "
            "here, and their gradient norms and learning rates are not in the record "
            "(auditlog events --kind untracked_updates)"
        )
    if kinds.get("hooks_removed"):
        gaps.append(
            "other code removed auditlog's hooks during the run: what they would have "
            "recorded meanwhile is missing (auditlog events --kind hooks_removed)"
        )
    return gaps
