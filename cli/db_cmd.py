"""``auditlog db``: schema revision of a store, and upgrades through Alembic."""

from __future__ import annotations

import click
from auditlog.cli.options import store_option


@click.group()
def db() -> None:
    """Store schema: show the revision, upgrade to the current one."""


@db.command()
@store_option
def current(store: str | None) -> None:
    """Print the store's schema revision and whether it is current."""
    from auditlog.read.api import head_revision, open_store

    head = head_revision()
    with open_store(store, allow_old=True) as opened:
        revision, shown = opened.revision, opened.location.display()
    state = "current" if revision == head else f"old: run `auditlog db upgrade` (head {head})"
    click.echo(f"{shown}: revision {revision} ({state})")


@db.command()
@store_option
def upgrade(store: str | None) -> None:
    """Create the store if none exists, or upgrade it to the current schema."""
    from auditlog.read.api import upgrade as upgrade_store

    before, after = upgrade_store(store)
    if before is None:
        click.echo(f"created store at revision {after}")
    elif before == after:
        click.echo(f"store already at revision {after}")
    else:
        click.echo(f"upgraded store from revision {before} to {after}")
