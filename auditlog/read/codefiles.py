"""Which files made a run's code dirty, from its ``run_started`` git record.

The recorder names the changed paths of the work tree (``git.files``: at most
``FILES_LISTED`` of them, modified first, then untracked, with ``files_total``;
``auditlog.recording.codestate``). ``auditlog diff`` and the report say from
these which files differ, not only that ``dirty`` went from false to true.
Records made before the files were named have none: the readers say nothing
more than the dirty flag then.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _files(git: dict[str, Any]) -> dict[str, dict[str, Any]]:
    listed = git.get("files")
    if not isinstance(listed, list):
        return {}
    return {
        str(f["path"]): f for f in listed if isinstance(f, dict) and isinstance(f.get("path"), str)
    }


def _unlisted(git: dict[str, Any]) -> int:
    total = git.get("files_total")
    return (
        max(0, total - len(_files(git)))
        if isinstance(total, int) and not isinstance(total, bool)
        else 0
    )


def describe(entry: dict[str, Any], note: str = "") -> str:
    """``train.py (modified)``, ``big.ckpt (untracked, 3221225472 bytes: size and mtime)``."""
    state = str(entry.get("state") or "changed") + note
    if entry.get("method") == "size_mtime":
        size = str(entry.get("identity") or "").split(":")[0]
        state += f", {size} bytes: size and mtime"
    old = entry.get("from")
    return f"{entry['path']}{f' (from {old})' if old else ''} ({state})"


def dirty_files(git: dict[str, Any]) -> list[str]:
    """The changed files a run's record names, described, and how many it left unnamed."""
    out = [describe(f) for f in _files(git).values()]
    more = _unlisted(git)
    if more:
        out.append(f"… and {more} more not listed")
    return out


def code_changes(
    git_a: dict[str, Any], git_b: dict[str, Any], fields: Sequence[str]
) -> dict[str, tuple[Any, Any]]:
    """The ``code`` fields that differ between two runs' git records, and ``files``:
    per side, the changed files that are not the same in the other run (a path
    only one of them had changed, or changed to different content)."""
    code = {
        key: (git_a.get(key), git_b.get(key)) for key in fields if git_a.get(key) != git_b.get(key)
    }
    files_a, files_b = _files(git_a), _files(git_b)

    def same(path: str) -> bool:
        a, b = files_a.get(path), files_b.get(path)
        keys = ("state", "method", "identity", "executable")
        return a is not None and b is not None and all(a.get(k) == b.get(k) for k in keys)

    paths = sorted(set(files_a) | set(files_b))
    differ = [p for p in paths if not same(p)]

    def note(path: str) -> str:
        return ", other content" if path in files_a and path in files_b else ""

    side_a = [describe(files_a[p], note(p)) for p in differ if p in files_a]
    side_b = [describe(files_b[p], note(p)) for p in differ if p in files_b]
    if not (side_a or side_b or git_a.get("diff_sha256") != git_b.get("diff_sha256")):
        return code
    for side, git in ((side_a, git_a), (side_b, git_b)):
        if _unlisted(git):
            side.append(f"… and {_unlisted(git)} more not listed")
    if side_a or side_b:
        code["files"] = (", ".join(side_a) or None, ", ".join(side_b) or None)
    return code
