"""graphsvc.view.server: the view's HTTP server, over real sockets against a server on a thread.

The model here is a stand-in that records its calls (the ViewModel itself is tested in
tests/view/test_model.py); what is tested is what the server adds: which files it serves and with
which headers, the Host check, how a request's query reaches the model, and its errors as JSON.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import struct
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from graphsvc.errors import UsageError
from graphsvc.view.server import FILES, STATIC, ViewServer

VENDOR = STATIC / "vendor"
TOO_MANY = "opening these groups would show 4,000 items; the page shows at most 3,000: close a group first"


class FakeModel:
    """Answers as the contract shapes them; records each call; fails as told."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def meta(self) -> dict[str, Any]:
        self.calls.append(("meta", None))
        return {"files": ["a<b>.msgpack"], "nodes": 7, "overlays": ["value"], "max_items": 3000}

    def view(self, open_groups: Sequence[int]) -> dict[str, Any]:
        self.calls.append(("view", list(open_groups)))
        if 99 in open_groups:
            raise UsageError(TOO_MANY)
        return {"items": [], "edges": [], "open": [0, *open_groups]}

    def node(self, node: int) -> dict[str, Any]:
        self.calls.append(("node", node))
        if node == 13:
            raise ZeroDivisionError("division by zero")
        if node >= 7:
            raise UsageError(f"no node with id {node} (the graph has 7 nodes)")
        return {"id": node, "label": "<script>alert(1)</script>"}

    def search(self, query: str, limit: int = 50) -> dict[str, Any]:
        self.calls.append(("search", (query, limit)))
        return {"matches": [], "more": False}


@pytest.fixture
def served() -> Iterator[tuple[ViewServer, FakeModel]]:
    model = FakeModel()
    server = ViewServer(model)  # type: ignore[arg-type]
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server, model
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def get(
    server: ViewServer, path: str, host: str | None = None, method: str = "GET"
) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(server.url.rstrip("/") + path, method=method)
    if host is not None:
        request.add_header("Host", host)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def test_it_binds_127_0_0_1_on_a_free_port(served: tuple[ViewServer, FakeModel]) -> None:
    server, _ = served
    assert server.server_address[0] == "127.0.0.1"
    assert server.port > 0
    assert server.url == f"http://127.0.0.1:{server.port}/"


@pytest.mark.parametrize("path", sorted(FILES))
def test_the_page_files_are_served_as_they_are_on_disk_with_their_type_and_security_headers(
    served: tuple[ViewServer, FakeModel], path: str
) -> None:
    server, _ = served
    status, headers, body = get(server, path)
    name, kind = FILES[path]
    assert (status, body) == (200, (STATIC / name).read_bytes())
    assert headers["Content-Type"] == kind
    assert headers["Content-Security-Policy"] == "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'"
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Content-Length"] == str(len(body))


def test_the_page_has_no_inline_script_and_loads_only_its_own_files() -> None:
    html = (STATIC / "index.html").read_text(encoding="utf-8")
    scripts = html.split("<script")[1:]
    tags = [part.split(">", 1)[0] for part in scripts]
    assert tags == [' src="/vendor/elk.bundled.js" defer', ' src="/app.js" defer']
    assert all(part.split(">", 1)[1].startswith("</script") for part in scripts)  # nothing between the tags
    assert re.findall(r'(?:src|href)="([^"]*)"', html) == ["data:,", "/style.css", "/vendor/elk.bundled.js", "/app.js"]
    assert re.findall(r"\son[a-z]+=", html) == []  # no inline event handler


def test_the_page_script_never_writes_markup_from_data() -> None:
    script = (STATIC / "app.js").read_text(encoding="utf-8")
    for risky in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert risky not in script


@pytest.mark.parametrize(
    ("path", "status", "error"),
    [
        ("/etc/passwd", 404, "not found: /etc/passwd"),
        ("/../server.py", 404, "not found: /../server.py"),
        ("/static/app.js", 404, "not found: /static/app.js"),
        ("/vendor/package.json", 404, "not found: /vendor/package.json"),
        ("/api/nothing", 404, "no such API: /api/nothing"),
        ("/api/view?open=1,x", 400, "open: expected integers separated by commas"),
        ("/api/view?open=99", 400, TOO_MANY),
        ("/api/node", 400, "id: a node id is required"),
        ("/api/node?id=", 400, "id: one node id is required"),
        ("/api/node?id=1,2", 400, "id: one node id is required"),
        ("/api/node?id=7", 400, "no node with id 7 (the graph has 7 nodes)"),
        ("/api/node?id=13", 500, "internal error: ZeroDivisionError: division by zero"),
        ("/api/search?q=a&limit=0", 400, "limit: expected an integer from 1 to 1000"),
        ("/api/search?q=a&limit=ten", 400, "limit: expected integers separated by commas"),
    ],
)
def test_errors_are_json_with_their_status(
    served: tuple[ViewServer, FakeModel], path: str, status: int, error: str
) -> None:
    server, _ = served
    got, headers, body = get(server, path)
    assert (got, headers["Content-Type"], json.loads(body)) == (status, "application/json", {"error": error})
    assert headers["X-Content-Type-Options"] == "nosniff"


def test_the_api_passes_the_query_to_the_model_and_answers_json(served: tuple[ViewServer, FakeModel]) -> None:
    server, model = served
    assert json.loads(get(server, "/api/graph")[2])["files"] == ["a<b>.msgpack"]
    assert json.loads(get(server, "/api/view?open=3,17,42")[2]) == {"items": [], "edges": [], "open": [0, 3, 17, 42]}
    assert json.loads(get(server, "/api/view")[2])["open"] == [0]
    status, headers, body = get(server, "/api/node?id=2")
    assert (status, headers["Content-Type"]) == (200, "application/json")
    assert body == b'{"id":2,"label":"<script>alert(1)</script>"}'
    get(server, "/api/search?q=Linear%201&limit=5")
    get(server, "/api/search?q=%23123")
    assert model.calls == [
        ("meta", None),
        ("view", [3, 17, 42]),
        ("view", []),
        ("node", 2),
        ("search", ("Linear 1", 5)),
        ("search", ("#123", 50)),
    ]


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "LOCALHOST:{port}"])
def test_its_own_address_in_the_host_header_is_served(served: tuple[ViewServer, FakeModel], host: str) -> None:
    server, _ = served
    assert get(server, "/api/graph", host=host.format(port=server.port))[0] == 200


@pytest.mark.parametrize("host", ["evil.example:{port}", "127.0.0.1", "localhost:1", "127.0.0.1:{port}.evil.example"])
def test_another_host_is_refused_so_a_rebound_dns_name_reads_nothing(
    served: tuple[ViewServer, FakeModel], host: str
) -> None:
    server, model = served
    status, _, body = get(server, "/api/graph", host=host.format(port=server.port))
    assert (status, json.loads(body)) == (403, {"error": "this server answers only requests for its own address"})
    assert get(server, "/", host=host.format(port=server.port))[0] == 403
    assert model.calls == []


def test_a_request_without_a_host_header_is_refused(served: tuple[ViewServer, FakeModel]) -> None:
    server, _ = served
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"GET /api/graph HTTP/1.0\r\n\r\n")
        answer = b"".join(iter(lambda: sock.recv(65536), b""))
    assert answer.startswith(b"HTTP/1.0 403 ")
    assert answer.endswith(b'{"error":"this server answers only requests for its own address"}')


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "HEAD"])
def test_only_get_is_served(served: tuple[ViewServer, FakeModel], method: str) -> None:
    server, model = served
    status, _, body = get(server, "/api/graph", method=method)
    assert status == 405
    assert body == (b"" if method == "HEAD" else b'{"error":"only GET is served"}')
    assert model.calls == []


def test_a_client_that_goes_away_mid_answer_leaves_no_traceback_and_the_server_serving(
    served: tuple[ViewServer, FakeModel], capfd: pytest.CaptureFixture[str]
) -> None:
    server, _ = served
    for _ in range(5):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        sock.sendall(f"GET /vendor/elk.bundled.js HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n\r\n".encode())
        sock.recv(100)  # the answer has begun (the file is 1.6 MB: most of it is still to be sent)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
        sock.close()
    assert get(server, "/api/graph")[0] == 200
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")


# -- the vendored JavaScript ----------------------------------------------------------------------------
def test_the_vendored_files_are_the_ones_the_manifest_pins() -> None:
    manifest = (VENDOR / "MANIFEST.sha256").read_text(encoding="utf-8").splitlines()
    pinned = dict(reversed(line.split("  ")) for line in manifest)
    assert sorted(pinned) == ["elk.LICENSE.md", "elk.bundled.js"]
    for name, digest in pinned.items():
        assert hashlib.sha256((VENDOR / name).read_bytes()).hexdigest() == digest, name


def test_the_vendored_package_is_pinned_with_its_integrity_hash() -> None:
    lock = json.loads((VENDOR / "package-lock.json").read_text(encoding="utf-8"))
    elk = lock["packages"]["node_modules/elkjs"]
    assert elk["version"] == json.loads((VENDOR / "package.json").read_text(encoding="utf-8"))["dependencies"]["elkjs"]
    assert elk["integrity"].startswith("sha512-")
    assert elk["license"] == "EPL-2.0 OR GPL-3.0-or-later"
    assert "Eclipse Public License" in (VENDOR / "elk.LICENSE.md").read_text(encoding="utf-8")
    # the bundle fetches nothing at run time: no address of another host is loaded by the page
    assert set(FILES.values()) >= {("vendor/elk.bundled.js", "text/javascript; charset=utf-8")}


def test_a_port_in_use_is_an_os_error_the_command_words(served: tuple[ViewServer, FakeModel]) -> None:
    server, model = served
    with pytest.raises(OSError):
        ViewServer(model, server.port)  # type: ignore[arg-type]


def test_static_files_are_all_listed() -> None:
    kinds = {".html", ".js", ".css"}
    on_disk = sorted(str(p.relative_to(STATIC)) for p in Path(STATIC).rglob("*") if p.suffix in kinds)
    assert on_disk == sorted({name for name, _ in FILES.values()})
