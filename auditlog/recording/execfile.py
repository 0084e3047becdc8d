"""Run an unmodified script or module as ``__main__`` (what ``auditlog run`` records).

Like ``python script.py`` / ``python -m mod``: ``sys.argv`` is the script and its
arguments, ``sys.path[0]`` is the script's directory (or the cwd for ``-m``).
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

from auditlog.core.errors import AuditlogError


def script_path(target: str, as_module: bool) -> Path:
    """The file whose git repository identifies the code being run."""
    if not as_module:
        path = Path(target)
        if not path.exists():
            raise AuditlogError(f"no such script: {target!r}")
        if path.is_dir() and not (path / "__main__.py").exists():
            raise AuditlogError(f"{target!r} is a directory without __main__.py")
        return path.absolute()
    import importlib.util

    sys.path.insert(0, os.getcwd())
    try:
        spec = importlib.util.find_spec(target)
    except (ImportError, ValueError) as exc:
        raise AuditlogError(f"cannot find module {target!r}: {exc}") from exc
    finally:
        sys.path.pop(0)
    if spec is None:
        raise AuditlogError(f"no module named {target!r}")
    return Path(spec.origin or os.getcwd()).absolute()


def run_target(target: str, args: list[str], as_module: bool) -> None:
    """Execute the target in this process; exceptions propagate to the caller."""
    if as_module:
        sys.argv = [target, *args]
        sys.path.insert(0, os.getcwd())
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        # argv[0] as typed; __file__ and tracebacks absolute, as python does (3.9+).
        path = Path(target).absolute()
        sys.argv = [target, *args]
        sys.path.insert(0, str(path if path.is_dir() else path.parent))
        runpy.run_path(str(path), run_name="__main__")


def exit_status(exc: SystemExit) -> int:
    """The process exit status ``sys.exit(code)`` gives, as the interpreter computes it:
    None is 0, an int is itself, anything else is printed by Python and means 1."""
    code = exc.code
    if code is None:
        return 0
    return code if isinstance(code, int) else 1
