"""``auditlog restore``: write a state_dict rebuilt from the record (safetensors or torch)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import click
from auditlog.cli.options import run_argument, store_option
from auditlog.cli.tree_cmd import check_step_or_seq, step_options

from auditlog.core.errors import AuditlogError, UsageError

FORMATS = {".safetensors": "safetensors", ".pt": "torch", ".pth": "torch"}


@click.command()
@store_option
@run_argument
@step_options
@click.option("-o", "--output", "output", required=True, type=click.Path(dir_okay=False, path_type=Path), help="File to write (.safetensors, .pt, .pth; another extension needs --format). Its directory must exist.")
@click.option("--format", "fmt", type=click.Choice(["safetensors", "torch"]), default=None, help="Output format (default: from the file extension).")
@click.option("--root", default=None, metavar="CLASS", help="Root module by class name (default: the one with the most parameters).")
@click.option("--allow-partial", is_flag=True, help="Write what was snapshotted even if some tensors were not.")
@click.option("--force", is_flag=True, help="Overwrite an existing output file.")
def restore(
    store: str | None,
    run: str,
    step: int | None,
    seq: int | None,
    output: Path,
    fmt: str | None,
    root: str | None,
    allow_partial: bool,
    force: bool,
) -> None:
    """Rebuild RUN's state_dict at --step N (or --seq N, default: the end) into a file.

    The file is created as any new file is (mode from the umask). A .safetensors
    file lists its tensors sorted by name; the state_dict's own key order is kept
    in its metadata under "auditlog.key_order" (a JSON list).
    """
    from auditlog.read.api import open_store
    from auditlog.read.restore import write_restored

    check_step_or_seq(step, seq)
    kind = fmt or FORMATS.get(output.suffix.lower())
    if kind is None:
        raise UsageError(
            f"cannot tell the format of {str(output)!r} from its extension: "
            "name it .safetensors, .pt or .pth, or give --format"
        )
    if output.exists() and not force:
        raise AuditlogError(f"{str(output)!r} exists; pass --force to overwrite it")
    parent = output.absolute().parent
    if not parent.is_dir():
        raise AuditlogError(f"directory {str(output.parent)!r} does not exist; create it first")
    fd, tmp = tempfile.mkstemp(prefix=".auditlog-restore-", suffix=output.suffix, dir=parent)
    os.close(fd)
    try:
        with open_store(store) as opened:
            view = opened.run(run)
            count = write_restored(view, Path(tmp), kind, step, seq, root, allow_partial)
            wrapped = view.wrappers_at(step, seq, root)
        os.chmod(tmp, 0o666 & ~_umask())  # a new file as any program makes it, not mkstemp's 0600
        os.replace(tmp, output)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    when = f"step {step}" if step is not None else (f"seq {seq}" if seq is not None else "end of run")
    click.echo(f"wrote {count} tensors of run {view.run_id[:12]} at {when} to {output}")
    if wrapped:
        keys = ", ".join(sorted(wrapped)[:5]) + (f" and {len(wrapped) - 5} more" if len(wrapped) > 5 else "")
        click.echo(
            f"note: {keys} held a tensor subclass ({next(iter(wrapped.values())).get('type')}); the file has its "
            "first inner tensor: Run.state_dict() in Python, with that class imported, rebuilds it whole",
            err=True,
        )


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
