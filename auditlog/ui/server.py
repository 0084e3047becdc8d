"""Serving the UI: the socket is bound here, then handed to uvicorn.

Binding first means a port in use (or an address this machine does not have)
is one clear error before anything starts, ``--port 0`` gets a free port whose
URL can be printed, and a browser opened right away finds the socket listening.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable

from auditlog.core.errors import AuditlogError, UsageError
from auditlog.read.api import Store, parallel_file_checks

INSTALL_HINT = (
    "the web UI needs the optional extra: pip install 'auditlog[ui]' (starlette and uvicorn)"
)


def check_installed() -> None:
    """A missing extra is a one-line error naming the install command."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise AuditlogError(INSTALL_HINT) from None


def is_loopback(host: str) -> bool:
    """Does ``host`` name this machine only (127.0.0.0/8, ::1, localhost)?"""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (0: a free port), or a one-line error."""
    if not 0 <= port <= 65535:
        raise UsageError(f"bad port {port}: ports are 0..65535")
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise UsageError(f"cannot listen on {host!r}: {exc.strerror or exc}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise AuditlogError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


def serve(
    store: Store,
    sock: socket.socket,
    hosts: list[str],
    started: Callable[[str], None],
    check_workers: int | None = None,
) -> None:
    """Answer on ``sock`` until interrupted; ``started(url)`` once it is listening.

    Worker processes (``check_workers``, default one per CPU up to 4) stand by to check
    many small snapshot files in parallel: without them a server's first verdict on a
    run of thousands of small files checks them one by one (later verdicts recall the
    files whose bytes are unchanged; ``auditlog.store.blobprove``)."""
    import uvicorn

    from auditlog.ui.app import create_app

    app = create_app(store, hosts)
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="off", server_header=False, ws="none"
    )
    server = uvicorn.Server(config)
    with parallel_file_checks(check_workers):
        started(url_of(sock))
        server.run(sockets=[sock])
