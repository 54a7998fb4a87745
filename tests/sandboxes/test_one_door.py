"""Every entry point to a sandbox meters through the one door, exactly once.

Walks every URL pattern under /api/ (Django's resolver) and every WebSocket route
(sandboxes/routing.py), drives each sandbox operation once through its real entry point
(REST view, consumer, preview proxy) against the local provider, and counts the usage
records the services write. EXPECTED lists every route: a new route without an entry here
fails, so nobody adds an entry point without saying how it is counted.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import HttpCommunicator, WebsocketCommunicator
from django.urls import URLPattern, URLResolver, get_resolver

from playground.asgi import application
from sandboxes import caller as caller_module
from sandboxes.models import Sandbox
from sandboxes.routing import websocket_urlpatterns
from sandboxes.terminals import terminal_manager

pytestmark = pytest.mark.django_db(transaction=True)

NOT_SANDBOX = None
"""Routes that act on no sandbox (accounts, billing, schema): not driven here."""

EXPECTED: dict[tuple[str, str], int | None] = {
    # sandboxes: lifecycle
    ("api/v1/sandboxes", "GET"): 0,
    ("api/v1/sandboxes", "POST"): 1,
    ("api/v1/sandboxes/<str:sandbox_id>", "GET"): 0,
    ("api/v1/sandboxes/<str:sandbox_id>", "DELETE"): 1,
    ("api/v1/sandboxes/<str:sandbox_id>/timeout", "POST"): 1,
    ("api/v1/sandboxes/<str:sandbox_id>/stats", "GET"): 0,
    # execution
    ("api/v1/sandboxes/<str:sandbox_id>/commands", "POST"): 1,
    ("api/v1/sandboxes/<str:sandbox_id>/code", "POST"): 1,
    ("api/v1/sandboxes/<str:sandbox_id>/languages", "GET"): 0,
    ("api/v1/run", "POST"): 1,
    # files
    ("api/v1/sandboxes/<str:sandbox_id>/files", "GET"): 1,
    ("api/v1/sandboxes/<str:sandbox_id>/files", "DELETE"): 1,
    ("api/v1/sandboxes/<str:sandbox_id>/files/content", "GET"): 1,
    ("api/v1/sandboxes/<str:sandbox_id>/files/content", "PUT"): 1,
    ("api/v1/sandboxes/<str:sandbox_id>/files/stat", "GET"): 1,
    ("api/v1/sandboxes/<str:sandbox_id>/files/exists", "GET"): 1,
    ("api/v1/sandboxes/<str:sandbox_id>/files/mkdir", "POST"): 1,
    ("api/v1/sandboxes/<str:sandbox_id>/files/move", "POST"): 1,
    # processes
    ("api/v1/sandboxes/<str:sandbox_id>/processes", "GET"): 1,
    ("api/v1/sandboxes/<str:sandbox_id>/processes", "POST"): 1,
    ("api/v1/sandboxes/<str:sandbox_id>/processes/<pid:pid>/signal", "POST"): 1,
    ("api/v1/sandboxes/<str:sandbox_id>/processes/<pid:pid>/output", "GET"): 1,
    ("api/v1/sandboxes/<str:sandbox_id>/commands", "POST background"): 1,
    # tokens, providers, terminals, ports
    ("api/v1/sandboxes/<str:sandbox_id>/tokens", "POST"): 1,
    ("api/v1/providers", "GET"): 0,
    ("api/v1/sandboxes/<str:sandbox_id>/terminals", "GET"): 0,
    ("api/v1/sandboxes/<str:sandbox_id>/terminals", "POST"): 1,
    ("api/v1/sandboxes/<str:sandbox_id>/terminals/<str:terminal_id>", "GET"): 0,
    ("api/v1/sandboxes/<str:sandbox_id>/terminals/<str:terminal_id>", "DELETE"): 1,
    ("api/v1/sandboxes/<str:sandbox_id>/terminals/<str:terminal_id>/resize", "POST"): 1,
    ("api/v1/sandboxes/<str:sandbox_id>/ports", "GET"): 1,
    # snapshots, fork, pause/resume (deleting a snapshot frees storage: not counted)
    ("api/v1/sandboxes/<str:sandbox_id>/snapshots", "GET"): 0,
    ("api/v1/sandboxes/<str:sandbox_id>/snapshots", "POST"): 1,
    ("api/v1/snapshots", "GET"): 0,
    ("api/v1/snapshots/<str:snapshot_id>", "GET"): 0,
    ("api/v1/snapshots/<str:snapshot_id>", "DELETE"): 0,
    ("api/v1/sandboxes", "POST snapshot"): 1,
    ("api/v1/sandboxes/<str:sandbox_id>/fork", "POST"): 1,
    ("api/v1/sandboxes/<str:sandbox_id>/pause", "POST"): 1,
    ("api/v1/sandboxes/<str:sandbox_id>/resume", "POST"): 1,
    # WebSocket routes (connecting counts nothing; each operation on the socket does)
    ("ws/sandboxes/<str:sandbox_id>/terminals/<str:terminal_id>", "input line"): 1,
    ("ws/sandboxes/<str:sandbox_id>/events", "connect"): 0,
    ("ws/sandboxes/<str:sandbox_id>/events", "watch"): 1,
    ("ws/sandboxes/<str:sandbox_id>/exec", "run"): 1,
    ("ws/sandboxes/<str:sandbox_id>/exec", "stdin"): 1,
    (r"^sandboxes/[A-Za-z0-9_-]+/ports/[0-9]+(/.*)?$", "websocket"): 1,
    # the preview proxy's HTTP side (sandboxes.routing.http_app)
    ("sandboxes/<id>/ports/<port>/", "GET"): 1,
    # not sandbox operations
    ("api/v1/organization", "GET"): NOT_SANDBOX,
    ("api/v1/organization", "PATCH"): NOT_SANDBOX,
    ("api/v1/members", "GET"): NOT_SANDBOX,
    ("api/v1/members/<int:member_id>", "PATCH"): NOT_SANDBOX,
    ("api/v1/members/<int:member_id>", "DELETE"): NOT_SANDBOX,
    ("api/v1/invitations", "GET"): NOT_SANDBOX,
    ("api/v1/invitations", "POST"): NOT_SANDBOX,
    ("api/v1/invitations/<int:invitation_id>", "DELETE"): NOT_SANDBOX,
    ("api/v1/invitations/<int:invitation_id>/resend", "POST"): NOT_SANDBOX,
    ("api/v1/api-keys", "GET"): NOT_SANDBOX,
    ("api/v1/api-keys", "POST"): NOT_SANDBOX,
    ("api/v1/api-keys/<int:key_id>", "DELETE"): NOT_SANDBOX,
    ("api/v1/usage", "GET"): NOT_SANDBOX,
    ("api/v1/usage.csv", "GET"): NOT_SANDBOX,
    ("api/v1/invoices", "GET"): NOT_SANDBOX,
    ("api/v1/invoices/upcoming", "GET"): NOT_SANDBOX,
    ("api/v1/invoices/<int:invoice_id>", "GET"): NOT_SANDBOX,
    ("api/v1/invoices/<int:invoice_id>/mark-paid", "POST"): NOT_SANDBOX,
    ("api/v1/billing/plan", "GET"): NOT_SANDBOX,
    ("api/v1/billing/plan", "POST"): NOT_SANDBOX,
    ("api/v1/billing/spending-cap", "PUT"): NOT_SANDBOX,
    # templates: not sandbox operations; a build counts once (tests/sandboxes/test_templates_api.py)
    ("api/v1/templates", "GET"): NOT_SANDBOX,
    ("api/v1/templates", "POST"): NOT_SANDBOX,
    ("api/v1/templates/<str:template_id>", "GET"): NOT_SANDBOX,
    ("api/v1/templates/<str:template_id>", "DELETE"): NOT_SANDBOX,
    ("api/v1/templates/<str:template_id>/log", "GET"): NOT_SANDBOX,
    ("api/schema/", "GET"): NOT_SANDBOX,
    ("api/docs/", "GET"): NOT_SANDBOX,
}

VARIANTS = {
    ("api/v1/sandboxes/<str:sandbox_id>/commands", "POST background"),
    ("api/v1/sandboxes", "POST snapshot"),
}
"""A route's second way in, driven on its own: a background command starts a process; a
create from a snapshot restores its files."""

WS_OPERATIONS = {
    "ws/sandboxes/<str:sandbox_id>/terminals/<str:terminal_id>": {"input line"},
    "ws/sandboxes/<str:sandbox_id>/events": {"connect", "watch"},
    "ws/sandboxes/<str:sandbox_id>/exec": {"run", "stdin"},
    r"^sandboxes/[A-Za-z0-9_-]+/ports/[0-9]+(/.*)?$": {"websocket"},
}

# A server for the preview's both sides, stdlib only: a WebSocket handshake when asked for
# one (then it holds the socket), else a small HTTP answer.
PREVIEW_SERVER = r"""
import base64, hashlib, socket, threading
MAGIC = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
def serve(conn):
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = conn.recv(4096)
        if not chunk:
            return
        head += chunk
    lines = head.split(b"\r\n")
    key = [l.split(b":", 1)[1].strip() for l in lines if l.lower().startswith(b"sec-websocket-key:")]
    if key:
        accept = base64.b64encode(hashlib.sha1(key[0] + MAGIC).digest())
        conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                     b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
        while conn.recv(4096):
            pass
    else:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
    conn.close()
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", 8000))
server.listen()
while True:
    conn, _ = server.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""


def _api_routes() -> Iterator[tuple[str, str]]:
    def walk(patterns: list[Any], prefix: str) -> Iterator[tuple[str, Any]]:
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                yield from walk(pattern.url_patterns, prefix + str(pattern.pattern))
            elif isinstance(pattern, URLPattern):
                yield prefix + str(pattern.pattern), pattern.callback

    for path, callback in walk(get_resolver().url_patterns, ""):
        if not path.startswith("api/"):
            continue
        view = getattr(callback, "cls", None) or getattr(callback, "view_class", None)
        for method in ("get", "post", "put", "patch", "delete"):
            if view is not None and hasattr(view, method):
                yield path, method.upper()


def _ws_routes() -> Iterator[tuple[str, str]]:
    for pattern in websocket_urlpatterns:
        route = str(pattern.pattern)
        for operation in WS_OPERATIONS.get(route, {"(unlisted)"}):
            yield route, operation


def test_every_route_has_an_expected_count() -> None:
    found = (
        set(_api_routes())
        | set(_ws_routes())
        | {("sandboxes/<id>/ports/<port>/", "GET")}
        | VARIANTS
    )
    assert found - set(EXPECTED) == set(), "routes without an entry in EXPECTED"
    assert set(EXPECTED) - found == set(), "EXPECTED lists routes that no longer exist"


class Meter:
    """Counts the usage records the services write (the real billing is not touched)."""

    def __init__(self) -> None:
        self.operations: list[str] = []
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)

    def record(self, **kwargs: Any) -> None:
        with self._changed:
            self.operations.append(kwargs["operation"])
            self._changed.notify_all()

    def wait_for(self, count: int, timeout_s: float = 10) -> None:
        """Block until `count` records exist (or the timeout passes)."""
        with self._changed:
            self._changed.wait_for(lambda: len(self.operations) >= count, timeout=timeout_s)

    def __len__(self) -> int:
        with self._lock:
            return len(self.operations)


def test_each_sandbox_operation_is_metered_exactly_once(  # type: ignore[no-untyped-def]
    monkeypatch, api_a, key_a, local_sandboxes, settings, tmp_path
):
    settings.SANDPIT_SNAPSHOT_DIR = tmp_path / "snapshots"
    meter = Meter()
    monkeypatch.setattr(caller_module, "metering_record", meter.record)
    counted: dict[tuple[str, str], int] = {}
    auth = [(b"authorization", f"Bearer {key_a}".encode())]
    sbx = "api/v1/sandboxes/<str:sandbox_id>"

    def rest(route: tuple[str, str], method: str, url: str, body: Any = None, **kw: Any) -> Any:
        before = len(meter)
        call = getattr(api_a, method.lower())
        if isinstance(body, dict):
            kw.setdefault("format", "json")
        response = call(url, body, **kw) if body is not None or kw else call(url)
        assert response.status_code < 400, (route, response.content)
        counted[route] = len(meter) - before
        return response

    async def eventually(route: tuple[str, str], before: int, expected: int) -> None:
        # Some records are written by a task after the answer (a preview WebSocket once the
        # sandbox's server accepted it): wait for that record.
        await sync_to_async(meter.wait_for, thread_sensitive=False)(before + expected)
        counted[route] = len(meter) - before

    async def session() -> None:
        terminal_manager.bind_loop(asyncio.get_running_loop())
        arest = sync_to_async(rest)

        await arest(("api/v1/sandboxes", "GET"), "GET", "/api/v1/sandboxes")
        created = await arest(("api/v1/sandboxes", "POST"), "POST", "/api/v1/sandboxes", {})
        sandbox_id = created.json()["id"]
        base = f"/api/v1/sandboxes/{sandbox_id}"
        await arest((sbx, "GET"), "GET", base)
        await arest((f"{sbx}/timeout", "POST"), "POST", f"{base}/timeout", {"timeout_s": 600})
        await arest((f"{sbx}/stats", "GET"), "GET", f"{base}/stats")
        await arest((f"{sbx}/commands", "POST"), "POST", f"{base}/commands", {"command": "true"})
        await arest(
            (f"{sbx}/code", "POST"), "POST", f"{base}/code", {"code": "1", "language": "python"}
        )
        await arest((f"{sbx}/languages", "GET"), "GET", f"{base}/languages")
        await arest(("api/v1/run", "POST"), "POST", "/api/v1/run", {"command": "echo one-shot"})
        content = f"{sbx}/files/content"
        await arest(
            (content, "PUT"),
            "PUT",
            f"{base}/files/content?path=a.txt",
            b"hello",
            content_type="application/octet-stream",
        )
        await arest((f"{sbx}/files", "GET"), "GET", f"{base}/files?path=.")
        await arest((f"{sbx}/files/stat", "GET"), "GET", f"{base}/files/stat?path=a.txt")
        await arest((content, "GET"), "GET", f"{base}/files/content?path=a.txt")
        await arest((f"{sbx}/files/exists", "GET"), "GET", f"{base}/files/exists?path=a.txt")
        await arest((f"{sbx}/files/mkdir", "POST"), "POST", f"{base}/files/mkdir", {"path": "d"})
        await arest(
            (f"{sbx}/files/move", "POST"),
            "POST",
            f"{base}/files/move",
            {"from": "a.txt", "to": "d/b.txt"},
        )
        await arest((f"{sbx}/files", "DELETE"), "DELETE", f"{base}/files?path=d&recursive=true")
        started = await arest(
            (f"{sbx}/processes", "POST"), "POST", f"{base}/processes", {"command": "sleep 300"}
        )
        await arest((f"{sbx}/processes", "GET"), "GET", f"{base}/processes")
        background = await arest(
            (f"{sbx}/commands", "POST background"),
            "POST",
            f"{base}/commands",
            {"command": "echo bg", "background": True},
        )
        await arest(
            (f"{sbx}/processes/<pid:pid>/output", "GET"),
            "GET",
            f"{base}/processes/{background.json()['pid']}/output",
        )
        await arest(
            (f"{sbx}/processes/<pid:pid>/signal", "POST"),
            "POST",
            f"{base}/processes/{started.json()['pid']}/signal",
            {"signal": "SIGKILL"},
        )
        await arest(
            (f"{sbx}/tokens", "POST"), "POST", f"{base}/tokens", {"scopes": ["exec"], "ttl_s": 60}
        )
        await arest(("api/v1/providers", "GET"), "GET", "/api/v1/providers")

        # terminals: REST, then a line typed over the socket
        terminals = f"{sbx}/terminals"
        await arest((terminals, "GET"), "GET", f"{base}/terminals")
        made = await arest((terminals, "POST"), "POST", f"{base}/terminals", {"shell": "/bin/sh"})
        terminal_id = made.json()["id"]
        one = f"{terminals}/<str:terminal_id>"
        await arest((one, "GET"), "GET", f"{base}/terminals/{terminal_id}")
        await arest(
            (f"{one}/resize", "POST"),
            "POST",
            f"{base}/terminals/{terminal_id}/resize",
            {"cols": 100, "rows": 30},
        )
        route = ("ws/sandboxes/<str:sandbox_id>/terminals/<str:terminal_id>", "input line")
        before = len(meter)
        ws = WebsocketCommunicator(application, made.json()["ws_path"], auth)
        assert (await ws.connect())[0]
        await ws.send_to(bytes_data=b"echo typed-$((6*7))\r")
        seen = b""
        while b"typed-42" not in seen:
            seen += (await ws.receive_output(timeout=20)).get("bytes") or b""
        await ws.disconnect()  # records what the socket typed
        counted[route] = len(meter) - before
        await arest((one, "DELETE"), "DELETE", f"{base}/terminals/{terminal_id}")

        # events: connecting counts nothing, a watcher counts once
        events = "ws/sandboxes/<str:sandbox_id>/events"
        before = len(meter)
        ws = WebsocketCommunicator(application, f"/ws/sandboxes/{sandbox_id}/events", auth)
        assert (await ws.connect())[0]
        assert (await ws.receive_json_from(timeout=10))["type"] == "ready"
        counted[(events, "connect")] = len(meter) - before
        before = len(meter)
        await ws.send_json_to({"type": "watch", "path": "."})
        while (await ws.receive_json_from(timeout=10))["type"] != "watching":
            pass
        counted[(events, "watch")] = len(meter) - before
        await ws.disconnect()

        # exec: a run counts once, each stdin message with data once
        exec_route = "ws/sandboxes/<str:sandbox_id>/exec"
        ws = WebsocketCommunicator(application, f"/ws/sandboxes/{sandbox_id}/exec", auth)
        assert (await ws.connect())[0]
        before = len(meter)
        await ws.send_json_to({"type": "run", "id": "r1", "command": "cat"})
        while (await ws.receive_json_from(timeout=20))["type"] != "started":
            pass
        counted[(exec_route, "run")] = len(meter) - before
        before = len(meter)
        await ws.send_json_to({"type": "stdin", "id": "r1", "data": "piped\n", "eof": True})
        while (message := await ws.receive_json_from(timeout=20))["type"] != "exit":
            assert message["type"] != "error", message
        counted[(exec_route, "stdin")] = len(meter) - before
        await ws.disconnect()

        # the preview proxy: a server in the sandbox, started beside the meter
        provider = local_sandboxes
        provider_id = (await sync_to_async(Sandbox.objects.get)(pk=sandbox_id)).provider_id
        provider.write_file(provider_id, "serve.py", PREVIEW_SERVER.encode())
        provider.start_process(provider_id, "python3", ["serve.py"], None, {})
        deadline = time.monotonic() + 20
        while not any(p.port == 8000 for p in provider.open_ports(provider_id)):
            assert time.monotonic() < deadline, "the preview server did not listen"
            await asyncio.sleep(0.05)
        await arest((f"{sbx}/ports", "GET"), "GET", f"{base}/ports")
        before = len(meter)
        http = HttpCommunicator(
            application, "GET", f"/sandboxes/{sandbox_id}/ports/8000/", headers=auth
        )
        answer = await http.get_response(timeout=20)
        assert answer["status"] == 200, answer
        counted[("sandboxes/<id>/ports/<port>/", "GET")] = len(meter) - before
        preview = r"^sandboxes/[A-Za-z0-9_-]+/ports/[0-9]+(/.*)?$"
        before = len(meter)
        ws = WebsocketCommunicator(application, f"/sandboxes/{sandbox_id}/ports/8000/", auth)
        assert (await ws.connect(timeout=20))[0]
        await eventually((preview, "websocket"), before, 1)
        await ws.disconnect()

        # snapshots, fork, pause/resume
        snaps = f"{sbx}/snapshots"
        taken = await arest((snaps, "POST"), "POST", f"{base}/snapshots", {"name": "s"})
        await arest((snaps, "GET"), "GET", f"{base}/snapshots")
        await arest(("api/v1/snapshots", "GET"), "GET", "/api/v1/snapshots")
        one_snapshot = "api/v1/snapshots/<str:snapshot_id>"
        snapshot_url = f"/api/v1/snapshots/{taken.json()['id']}"
        await arest((one_snapshot, "GET"), "GET", snapshot_url)
        await arest(
            ("api/v1/sandboxes", "POST snapshot"),
            "POST",
            "/api/v1/sandboxes",
            {"snapshot": taken.json()["id"]},
        )
        await arest((f"{sbx}/fork", "POST"), "POST", f"{base}/fork", {})
        await arest((one_snapshot, "DELETE"), "DELETE", snapshot_url)
        await arest((f"{sbx}/pause", "POST"), "POST", f"{base}/pause", {})
        await arest((f"{sbx}/resume", "POST"), "POST", f"{base}/resume", {})

        await arest((sbx, "DELETE"), "DELETE", base)

    async_to_sync(session)()
    expected = {route: count for route, count in EXPECTED.items() if count is not NOT_SANDBOX}
    assert counted == expected
    assert len(meter) == sum(expected.values())
