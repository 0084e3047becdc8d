"""``auditlog export``: write one run as a Parquet archive any engine can read, signed when a key is at hand."""

from __future__ import annotations

from pathlib import Path

import click
from auditlog.cli.options import run_argument, store_option
from auditlog.cli.progress import progress_bar


@click.command("export")
@store_option
@run_argument
@click.option(
    "--to",
    "to",
    required=True,
    type=click.Path(path_type=Path),
    metavar="DIR",
    help="A new (or empty) directory for the archive.",
)
@click.option(
    "--key",
    "key_path",
    default=None,
    metavar="PRIVATE",
    help="Sign the heads and the manifest [default: $AUDITLOG_KEY or ~/.config/auditlog/signing_key if it exists].",
)
def export(store: str | None, run: str, to: Path, key_path: str | None) -> None:
    """Write RUN (default: latest) to DIR as Parquet: events of every stream and snapshots,
    Hive-partitioned by run and stream, with a manifest and the signed heads.

    DuckDB, Spark or Trino read it without auditlog; `auditlog verify --archive DIR`
    checks it. A record that does not verify is not exported (exit 4).
    """
    from auditlog.archive.write import export_run
    from auditlog.integrity.keys import configured_private_key, load_private_key
    from auditlog.read.api import open_store

    key = load_private_key(Path(key_path)) if key_path else configured_private_key()
    with open_store(store) as opened:
        run_id = opened.select(run)
        total = opened.event_store.run_event_counts().get(run_id, (0, None))[0]
        with progress_bar(f"exporting {run_id[:12]}") as progress:
            done = [0]

            def tick(count: int) -> None:
                done[0] += count
                if progress is not None:
                    progress(done[0], total)

            manifest = export_run(opened.event_store, run_id, to, key, tick)
    events = sum(s["events"] for s in manifest["streams"])
    signed = (
        "signed" if key is not None else "not signed (no key: pass --key or run `auditlog keygen`)"
    )
    click.echo(
        f"exported run {run_id[:12]}: {events} events in {len(manifest['streams'])} stream(s), "
        f"{len(manifest['files'])} files to {to} ({signed})"
    )
