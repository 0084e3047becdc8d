"""The Starlette application of ``auditlog ui``: GET only, one store, nothing fetched from outside.

Safety, in layers:

- **Read-only.** Every route answers GET (and HEAD); any other method is
  refused with 405 before it reaches a route. The store is opened as the read
  API opens it (``create=False``); a query goes through the sandbox of
  ``auditlog query``. The only file written is the read model's cache, as by
  ``auditlog query``.
- **Stored text stays text.** The page builds every element with
  ``textContent`` (``static/app.js``), never markup from stored data; answers
  are JSON (``application/json``, ``nosniff``).
- **A strict Content-Security-Policy** on every answer: scripts, styles,
  images and connections from this server only (``default-src 'self'``, no
  inline script or style, no ``eval``), no frames, no plugins, no form posts.
  The page and its charting library are shipped in the package; nothing is
  loaded from a CDN, so the UI works air-gapped and no request leaves it.
- **Host header checked** (``TrustedHostMiddleware``): a page elsewhere that
  rebinds its DNS name to 127.0.0.1 cannot read the record through the browser.

Requests are answered one at a time (a lock around the store): the store's
connections and the read model's refresh are not shared between threads.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from auditlog.core.errors import AuditlogError, RunNotFoundError, UsageError, one_line
from auditlog.read.api import Store
from auditlog.ui import data

STATIC = Path(__file__).with_name("static")
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'; form-action 'none'"
)
HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
    "x-frame-options": "DENY",
    "cache-control": "no-store",
}
LOCAL_HOSTS = ["127.0.0.1", "localhost", "::1", "[::1]"]


class Guard:
    """Refuses every method but GET and HEAD, and puts the security headers on every answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "websocket":
                return  # no websockets: closing without accepting refuses it
            await self.app(scope, receive, send)
            return
        if scope["method"] not in ("GET", "HEAD"):
            refused = PlainTextResponse(
                "read-only: only GET is answered", 405, headers={"allow": "GET, HEAD"}
            )
            await self._secured(refused, scope, receive, send)
            return

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (k, v)
                    for k, v in message.get("headers", [])
                    if k.decode().lower() not in HEADERS
                ]
                headers += [(k.encode(), v.encode()) for k, v in HEADERS.items()]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_secured)

    async def _secured(
        self, response: Response, scope: Scope, receive: Receive, send: Send
    ) -> None:
        for key, value in HEADERS.items():
            response.headers[key] = value
        await response(scope, receive, send)


def json_response(value: Any, status: int = 200) -> Response:
    return Response(data.dumps(value), status, media_type="application/json")


def create_app(store: Store, hosts: list[str] | None = None) -> Starlette:
    """The UI over an open store (the caller closes it). ``hosts``: Host header names
    accepted besides the loopback ones (the address served on, when not loopback)."""
    lock = threading.Lock()

    def answering(work: Callable[[Request], Any]) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            def locked() -> Any:
                with lock:
                    return work(request)

            try:
                return json_response(await run_in_threadpool(locked))
            except RunNotFoundError as exc:
                return json_response({"error": one_line(exc)}, 404)
            except (UsageError, ValueError) as exc:
                return json_response({"error": one_line(exc)}, 400)
            except AuditlogError as exc:
                return json_response({"error": one_line(exc)}, 422)

        return endpoint

    def number(request: Request, name: str, default: int | None) -> int | None:
        value = request.query_params.get(name)
        if value is None or value == "":
            return default
        try:
            return int(value)
        except ValueError:
            raise UsageError(f"{name} must be a whole number, not {value!r}") from None

    def runs(request: Request) -> Any:
        params = request.query_params
        return data.runs_page(
            store,
            params.get("q", ""),
            params.get("status", ""),
            params.get("sort", "started"),
            params.get("order", "desc") != "asc",
            number(request, "offset", 0) or 0,
            number(request, "limit", 100) or 100,
        )

    def one(request: Request) -> Any:
        return data.run_summary(store, store.run(request.path_params["run"]))

    def tree(request: Request) -> Any:
        return data.tree_at(store.run(request.path_params["run"]), number(request, "step", None))

    def curves(request: Request) -> Any:
        return data.curves(store.run(request.path_params["run"]))

    def verify(request: Request) -> Any:
        return data.verdict(store.run(request.path_params["run"]))

    def compare(request: Request) -> Any:
        wanted = [s for s in request.query_params.get("runs", "").split(",") if s]
        return data.compare(store, wanted)

    def values(request: Request) -> Any:
        params = request.query_params
        return data.compare_values(store, params.get("a", ""), params.get("b", ""))

    def query(request: Request) -> Any:
        params = request.query_params
        return data.query(store, params.get("sql", ""), params.get("run") or None)

    def schema(request: Request) -> Any:
        return data.schema()

    async def index(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    routes = [
        Route("/", index),
        Route("/api/runs", answering(runs)),
        Route("/api/runs/{run}", answering(one)),
        Route("/api/runs/{run}/tree", answering(tree)),
        Route("/api/runs/{run}/curves", answering(curves)),
        Route("/api/runs/{run}/verify", answering(verify)),
        Route("/api/compare", answering(compare)),
        Route("/api/compare/values", answering(values)),
        Route("/api/query", answering(query)),
        Route("/api/schema", answering(schema)),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    allowed = [*LOCAL_HOSTS, *(hosts or [])]
    middleware = [Middleware(Guard), Middleware(TrustedHostMiddleware, allowed_hosts=allowed)]
    return Starlette(routes=routes, middleware=middleware)
