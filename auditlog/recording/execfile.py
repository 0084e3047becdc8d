"""Run an unmodified script or module as ``__main__`` (what ``auditlog run`` records).

Like ``python script.py`` / ``python -m mod``: ``sys.argv[0]`` is the script as
typed (for ``-m``: the module's file, as python sets it), ``sys.path[0]`` is the
script's directory (or the cwd for ``-m``), ``__file__`` and tracebacks name the
absolute path. A script runs in a fresh ``__main__`` module of its own (as
coverage.py's execfile does) rather than through ``runpy.run_path``, which would
set ``sys.argv[0]`` to the absolute path.

A module is looked up before the recording starts and without importing
anything, so ``auditlog run -m pkg`` on a package without ``__main__`` is one
line, as with python, and records no run.
"""

from __future__ import annotations

import builtins
import importlib.machinery
import importlib.util
import io
import os
import runpy
import sys
import types
from pathlib import Path
from typing import Any

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
    spec = find_module(target)
    return Path(spec.origin or os.getcwd()).absolute()


def find_module(name: str) -> importlib.machinery.ModuleSpec:
    """The spec ``python -m name`` would run (a package's ``__main__``), found without importing.

    Errors read as python's own (``No module named ...``), lower-cased like every
    other auditlog error.
    """
    parts = name.split(".")
    if not name or not all(part.isidentifier() for part in parts):
        raise AuditlogError(f"no module named {name}")
    search: list[str] | None = [os.getcwd(), *sys.path]
    spec: importlib.machinery.ModuleSpec | None = None
    for depth in range(1, len(parts) + 1):
        full = ".".join(parts[:depth])
        if search is None:
            raise AuditlogError(
                f"no module named {name}; {'.'.join(parts[: depth - 1])!r} is not a package"
            )
        spec = importlib.machinery.PathFinder.find_spec(full, search)
        if spec is None and depth == 1:
            spec = _builtin_spec(full)  # built-in and frozen modules have no path
        if spec is None:
            raise AuditlogError(f"no module named {full}")
        locations = spec.submodule_search_locations
        search = list(locations) if locations is not None else None
    assert spec is not None
    if search is not None:  # a package: python runs its __main__ submodule
        main = importlib.machinery.PathFinder.find_spec(f"{name}.__main__", search)
        if main is None:
            raise AuditlogError(
                f"no module named {name}.__main__; {name!r} is a package and cannot be directly executed"
            )
        spec = main
    return spec


def _builtin_spec(name: str) -> importlib.machinery.ModuleSpec | None:
    for finder in (importlib.machinery.BuiltinImporter, importlib.machinery.FrozenImporter):
        found = finder.find_spec(name)
        if found is not None:
            return found
    return None


def run_target(target: str, args: list[str], as_module: bool) -> dict[str, Any]:
    """Execute the target in this process; exceptions propagate to the caller.

    Returns the script's globals: the caller keeps them until the recording has
    ended, so a model held in a global is still alive for the run-end snapshot
    (as it is at the end of ``with auditlog.record():`` in a script).
    """
    if as_module:
        # run_module(alter_sys=True) sets argv[0] to the module's file, as python -m does.
        sys.argv = [target, *args]
        sys.path.insert(0, os.getcwd())
        return runpy.run_module(target, run_name="__main__", alter_sys=True)
    sys.argv = [target, *args]  # argv[0] as typed
    path = Path(target).absolute()
    if path.is_dir() or path.suffix not in ("", ".py", ".pyw"):
        # A directory or zip file with __main__.py, or compiled code: runpy knows
        # these; given the path as typed it sets argv[0] and sys.path[0] to it.
        return runpy.run_path(target, run_name="__main__")
    sys.path.insert(0, str(path.parent))
    return _exec_script(path)


def _exec_script(path: Path) -> dict[str, Any]:
    """Run a source file as ``__main__`` with ``__file__`` and code paths absolute (python 3.9+)."""
    with io.open_code(str(path)) as handle:
        source = handle.read()
    code = compile(source, str(path), "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__file__ = str(path)
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", str(path))
    main.__spec__ = None
    previous = sys.modules.get("__main__")
    sys.modules["__main__"] = main
    try:
        exec(code, main.__dict__)
    finally:
        if previous is not None:
            sys.modules["__main__"] = previous
    return main.__dict__


def user_traceback(exc: BaseException) -> BaseException:
    """``exc`` with auditlog's own frames (and runpy's) cut from the top of its traceback.

    What remains starts at the script's first frame: what ``python script.py``
    prints, and what ``run_ended`` stores.
    """
    tb = exc.__traceback__
    while tb is not None and _is_ours(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return exc.with_traceback(tb)


def _is_ours(filename: str) -> bool:
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # auditlog/
    cli = _cli_directory()
    return (
        filename.startswith(package)
        or (cli is not None and filename.startswith(cli))
        or filename in ("<frozen runpy>", runpy.__file__)
        or filename.endswith(os.path.join("click", "core.py"))
    )


def _cli_directory() -> str | None:
    """Where the CLI's modules are (``cli/`` in a checkout, ``auditlog/cli`` when installed)."""
    module = sys.modules.get("auditlog.cli")
    if module is None or not getattr(module, "__file__", None):
        return None
    return os.path.dirname(os.path.abspath(str(module.__file__))) + os.sep


def exit_status(exc: SystemExit) -> int:
    """The process exit status ``sys.exit(code)`` gives, as the interpreter computes it:
    None is 0, an int is itself, anything else is printed by Python and means 1."""
    code = exc.code
    if code is None:
        return 0
    return code if isinstance(code, int) else 1
