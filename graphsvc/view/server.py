"""The HTTP side of ``graphsvc view``: the page's files and the ViewModel's answers as JSON, on 127.0.0.1.

The standard library's ThreadingHTTPServer, nothing more. Every request must name this server in its
Host header (127.0.0.1:PORT or localhost:PORT): a page on another site that rebinds its DNS name to
127.0.0.1 is refused. The page's files are a fixed list (no path from a request reaches the file
system); answers carry a Content-Security-Policy that allows only this server's own files, so a name
from a graph file can never run as script. A client that goes away mid-answer is no error.
"""

from __future__ import annotations

import json
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from graphsvc.errors import UsageError

if TYPE_CHECKING:
    from graphsvc.view.model import ViewModel

STATIC = Path(__file__).resolve().parent / "static"

#: The page's files: URL path -> (file under static/, content type). Nothing else is served from disk.
FILES: dict[str, tuple[str, str]] = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/style.css": ("style.css", "text/css; charset=utf-8"),
    "/vendor/elk.bundled.js": ("vendor/elk.bundled.js", "text/javascript; charset=utf-8"),
}

#: Sent with every answer.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

#: The most results a search may ask for.
MAX_LIMIT = 1000


class BadRequest(Exception):
    """A request this server answers with an error: its HTTP status and one-line message."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def _ints(text: str, what: str) -> list[int]:
    """``3,17,42`` as ints (an empty text: none)."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    try:
        return [int(part) for part in parts]
    except ValueError:
        raise BadRequest(HTTPStatus.BAD_REQUEST, f"{what}: expected integers separated by commas") from None


def _one(query: dict[str, list[str]], key: str) -> str | None:
    values = query.get(key)
    return values[-1] if values else None


def answer(model: ViewModel, path: str, query: dict[str, list[str]]) -> Any:
    """The JSON answer to ``GET path?query`` under /api/; BadRequest, or the model's UsageError."""
    if path == "/api/graph":
        return model.meta()
    if path == "/api/view":
        return model.view(_ints(_one(query, "open") or "", "open"))
    if path == "/api/node":
        given = _one(query, "id")
        if given is None:
            raise BadRequest(HTTPStatus.BAD_REQUEST, "id: a node id is required")
        ids = _ints(given, "id")
        if len(ids) != 1:
            raise BadRequest(HTTPStatus.BAD_REQUEST, "id: one node id is required")
        return model.node(ids[0])
    if path == "/api/search":
        text = _one(query, "q") or ""
        limit_text = _one(query, "limit")
        limit = 50
        if limit_text is not None:
            limits = _ints(limit_text, "limit")
            if len(limits) != 1 or not 1 <= limits[0] <= MAX_LIMIT:
                raise BadRequest(HTTPStatus.BAD_REQUEST, f"limit: expected an integer from 1 to {MAX_LIMIT}")
            limit = limits[0]
        return model.search(text, limit)
    raise BadRequest(HTTPStatus.NOT_FOUND, f"no such API: {path}")


class ViewHandler(BaseHTTPRequestHandler):
    """One request to the view server (``self.server`` is a ViewServer)."""

    server: ViewServer
    server_version = "graphsvc-view"
    sys_version = ""

    def do_GET(self) -> None:
        try:
            self._get()
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            self.close_connection = True  # the client went away: nothing to tell it

    def do_HEAD(self) -> None:
        self._send_error(HTTPStatus.METHOD_NOT_ALLOWED, "only GET is served")

    def do_POST(self) -> None:
        self._send_error(HTTPStatus.METHOD_NOT_ALLOWED, "only GET is served")

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_POST

    def _get(self) -> None:
        if not self.server.host_allowed(self.headers.get("Host")):
            self._send_error(HTTPStatus.FORBIDDEN, "this server answers only requests for its own address")
            return
        parts = urlsplit(self.path)
        if parts.path in FILES:
            name, kind = FILES[parts.path]
            self._send(HTTPStatus.OK, kind, (STATIC / name).read_bytes())
            return
        if not parts.path.startswith("/api/"):
            self._send_error(HTTPStatus.NOT_FOUND, f"not found: {parts.path}")
            return
        try:
            query = parse_qs(parts.query, keep_blank_values=True, max_num_fields=16)
        except ValueError:
            self._send_error(HTTPStatus.BAD_REQUEST, "too many query parameters")
            return
        try:
            with self.server.lock:  # the model is plain data, not written for threads
                body = answer(self.server.model, parts.path, query)
        except BadRequest as exc:
            self._send_error(exc.status, str(exc))
            return
        except UsageError as exc:
            self._send_error(HTTPStatus.BAD_REQUEST, str(exc))
            return
        except Exception as exc:  # the model's bug: the page says so, the server keeps serving
            self._send_error(HTTPStatus.INTERNAL_SERVER_ERROR, f"internal error: {type(exc).__name__}: {exc}")
            return
        self._send_json(HTTPStatus.OK, body)

    def _send_error(self, status: HTTPStatus, message: str) -> None:
        self._send_json(status, {"error": message})

    def _send_json(self, status: HTTPStatus, body: Any) -> None:
        data = json.dumps(body, allow_nan=False, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        self._send(status, "application/json", data)

    def _send(self, status: HTTPStatus, kind: str, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        for key, value in SECURITY_HEADERS.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """Requests are not logged: the terminal shows only the serving line and errors."""


class ViewServer(ThreadingHTTPServer):
    """Serves one ViewModel on 127.0.0.1 (``port`` 0: a free port)."""

    daemon_threads = True

    def __init__(self, model: ViewModel, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), ViewHandler)
        self.model = model
        self.lock = threading.Lock()
        self.port: int = self.server_address[1]
        self.allowed_hosts = {f"127.0.0.1:{self.port}", f"localhost:{self.port}"}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def host_allowed(self, host: str | None) -> bool:
        return host is not None and host.lower() in self.allowed_hosts

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that failed (the client went away) is dropped without a traceback."""
