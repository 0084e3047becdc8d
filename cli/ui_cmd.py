"""``auditlog ui``: browse the record in a browser, read-only, served from this machine."""

from __future__ import annotations

import sys

import click
from auditlog.cli.options import store_option


@click.command()
@store_option
@click.option(
    "--port", type=int, default=8765, show_default=True, help="Port to listen on (0: a free one)."
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on. Another than this machine's loopback only when asked, with a warning: "
    "the UI has no login.",
)
@click.option(
    "--open", "open_browser", is_flag=True, help="Open the UI in the default web browser."
)
@click.option(
    "--check-workers",
    type=click.IntRange(min=0),
    default=None,
    help="Worker processes that check a run's small snapshot files in parallel for its first "
    "verdict (default: one per CPU, at most 4; 0 or 1: none).",
)
def ui(
    store: str | None, port: int, host: str, open_browser: bool, check_workers: int | None
) -> None:
    """Serve a read-only web UI of the store: runs, a run (module tree at any step,
    curves with NaN/Inf marked, the non-finite finding, snapshots, annotations, the
    verify verdict), compare runs (curves and diff), and SQL over the views.

    Nothing is written (only GET is answered; the store is read as `auditlog
    query` reads it) and nothing is fetched from outside: the page and its
    charting library ship with auditlog. Needs the extra auditlog[ui]. Ctrl-C
    stops it.
    """
    from auditlog.read.api import open_store
    from auditlog.ui.server import bind, check_installed, is_loopback, serve

    check_installed()
    hosts = []
    if not is_loopback(host):
        click.echo(
            f"warning: serving on {host}: anyone who can reach this address can read the whole record "
            "(the UI has no login); the default, 127.0.0.1, serves this machine only",
            err=True,
        )
        hosts = ["*"] if host in ("0.0.0.0", "::", "") else [host]
    with open_store(store) as opened:
        sock = bind(host, port)

        def started(url: str) -> None:
            click.echo(
                f"auditlog ui: store {opened.location.display()} at {url} (read-only; Ctrl-C stops it)"
            )
            sys.stdout.flush()
            if open_browser:
                import webbrowser

                webbrowser.open(url)

        try:
            serve(opened, sock, hosts, started, check_workers)
        finally:
            sock.close()
