"""``auditlog restore``: write a state_dict rebuilt from the record (safetensors or torch)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import click
from auditlog.cli.options import run_argument, store_option
from auditlog.cli.tree_cmd import step_options

from auditlog.core.errors import AuditlogError

FORMATS = {".safetensors": "safetensors", ".pt": "torch", ".pth": "torch", ".bin": "torch"}


@click.command()
@store_option
@run_argument
@step_options
@click.option("-o", "--output", "output", required=True, type=click.Path(dir_okay=False, path_type=Path), help="File to write (.safetensors, .pt, .pth).")
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
    """Rebuild RUN's state_dict at --step N (or --seq N, default: the end) into a file."""
    import torch

    from auditlog.read.api import open_store

    kind = fmt or FORMATS.get(output.suffix.lower())
    if kind is None:
        raise AuditlogError(f"cannot tell the format of {str(output)!r}: use .safetensors or .pt, or --format")
    if output.exists() and not force:
        raise AuditlogError(f"{str(output)!r} exists; pass --force to overwrite it")
    with open_store(store) as opened:
        view = opened.run(run)
        state = view.state_dict(step=step, seq=seq, root=root, allow_partial=allow_partial)
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="auditlog-restore-", suffix=output.suffix, dir=output.parent)
    os.close(fd)
    try:
        if kind == "safetensors":
            from safetensors.torch import save_file

            # safetensors refuses aliased tensors (tied weights): give each key its own copy.
            seen: set[int] = set()
            unique = {}
            for key, tensor in state.items():
                unique[key] = tensor.clone() if id(tensor) in seen else tensor
                seen.add(id(tensor))
            save_file({k: v.contiguous() for k, v in unique.items()}, tmp, metadata={"auditlog.run": view.run_id})
        else:
            torch.save(state, tmp)
        os.replace(tmp, output)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    when = f"step {step}" if step is not None else (f"seq {seq}" if seq is not None else "end of run")
    click.echo(f"wrote {len(state)} tensors of run {view.run_id[:12]} at {when} to {output}")
