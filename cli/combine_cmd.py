"""``auditlog combine``: merge per-rank shard stores into one store (like ``coverage combine``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from auditlog.cli.options import format_option
from auditlog.cli.output import emit_rows

from auditlog.core.errors import AuditlogError

COLUMNS = ("shard", "runs", "added", "present", "snapshots", "result")


@click.command()
@click.argument("shards", nargs=-1, metavar="[SHARD]...")
@click.option(
    "--into",
    "into",
    envvar="AUDITLOG_STORE",
    required=True,
    metavar="DIR|URL|FILE.toml",
    help="The store to combine into (created when missing) [env AUDITLOG_STORE].",
)
@click.option(
    "--snapshots",
    default=None,
    metavar="PATH",
    help="Snapshot directory of a database target store.",
)
@click.option("--delete", is_flag=True, help="Delete each shard once all of it is in the target.")
@format_option
def combine(
    shards: tuple[str, ...], into: str, snapshots: str | None, delete: bool, fmt: str
) -> None:
    """Merge shard stores (default: every shard under STORE/shards/) into the --into store.

    Streams keep their hash chains; events the target already holds are skipped, so
    combining twice adds nothing. A shard that cannot be read, or whose record does
    not verify, is reported and left in place. Originals are kept unless --delete.
    """
    from auditlog.read.api import SHARDS_DIR, resolve_store
    from auditlog.recording.combine import combine as combine_shards

    target = resolve_store(into, snapshots)
    chosen = list(shards)
    if not chosen and target.directory is not None:
        chosen = sorted(str(p) for p in (target.directory / SHARDS_DIR).glob("*") if p.is_dir())
    if not chosen:
        raise AuditlogError(
            f"no shards to combine (none given, none under {str(Path(into) / SHARDS_DIR)!r})"
        )
    report = combine_shards(target, chosen, delete=delete)
    rows: list[dict[str, Any]] = []
    for result in report.shards:
        if result.refused is not None:
            outcome = f"left in place: {result.refused}"
        elif result.conflicts:
            outcome = "conflict: " + "; ".join(result.conflicts)
        else:
            outcome = "combined" + (", deleted" if result.deleted else "")
            if result.checkpoints_left:
                outcome += f" ({result.checkpoints_left} signed checkpoint(s) not carried over)"
        rows.append(
            {
                "shard": result.shard,
                "runs": len(result.runs),
                "added": result.events_added,
                "present": result.events_present,
                "snapshots": result.blobs_added,
                "result": outcome,
            }
        )
    emit_rows(rows, COLUMNS, fmt, title=f"combined into {report.target}")
    failed = [r for r in report.shards if not r.ok]
    if failed:
        first = failed[0]
        why = first.refused or "; ".join(first.conflicts)
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        raise AuditlogError(
            f"shard {first.shard!r} was not combined and is left in place: {why}{more}"
        )
