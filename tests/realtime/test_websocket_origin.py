"""WebSocket Origin checks compare scheme, host and port, like Django's CSRF origin check.

A page on another port or scheme of the same host is another origin: it must not open a
terminal (or any socket) with the user's cookies. Checked on every WebSocket route against a
live daphne, and in process for the settings that change the server's own origin.
"""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.test import Client
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

pytestmark = pytest.mark.django_db(transaction=True)

SANDBOX = "sbx_nosuchsandbox"


def _route_paths() -> list[str]:
    """One path per WebSocket route (a sandbox that does not exist: the Origin check comes
    before authentication and tenancy, which then answer 4401/4404)."""
    from sandboxes.routing import websocket_urlpatterns

    known = {
        "ws/sandboxes/<str:sandbox_id>/terminals/<str:terminal_id>": (
            f"/ws/sandboxes/{SANDBOX}/terminals/term_x"
        ),
        "ws/sandboxes/<str:sandbox_id>/events": f"/ws/sandboxes/{SANDBOX}/events",
        "ws/sandboxes/<str:sandbox_id>/exec": f"/ws/sandboxes/{SANDBOX}/exec",
        "^sandboxes/[A-Za-z0-9_-]+/ports/[0-9]+(/.*)?$": f"/sandboxes/{SANDBOX}/ports/8000/ws",
    }
    paths = []
    for pattern in websocket_urlpatterns:
        route = str(pattern.pattern)
        assert route in known, f"new WebSocket route {route}: add it to this test"
        paths.append(known[route])
    return paths


def _close_code(ws: Any) -> int:
    with pytest.raises(ConnectionClosed) as closed:
        for _ in range(20):
            ws.recv(timeout=10)
    return closed.value.rcvd.code  # type: ignore[union-attr]


def _open(server: Any, path: str, origin: str | None, headers: dict[str, str]) -> Any:
    return connect(
        f"ws://127.0.0.1:{server.port}{path}",
        origin=origin,  # type: ignore[arg-type]
        additional_headers=headers,
        open_timeout=10,
    )


def test_other_ports_schemes_and_hosts_are_refused_on_every_route(server, key_a):  # type: ignore[no-untyped-def]
    port = server.port
    foreign = [
        f"http://127.0.0.1:{port + 1}",  # another port of the same host
        f"https://127.0.0.1:{port}",  # another scheme
        "http://127.0.0.1",  # port 80
        f"http://localhost:{port}",  # another host name (both are in ALLOWED_HOSTS)
        f"http://evil.example:{port}",
        "null",  # sandboxed frames and file: pages
        f"ws://127.0.0.1:{port}",  # not a page's origin
    ]
    credentials = {"Authorization": f"Bearer {key_a}"}
    for path in _route_paths():
        for origin in foreign:
            with pytest.raises(InvalidStatus) as refused:
                _open(server, path, origin, credentials)
            assert refused.value.response.status_code == 403, (path, origin)
        # The server's own origin passes the check; the missing sandbox then answers 4404.
        with _open(server, path, server.origin, credentials) as ws:
            assert _close_code(ws) == 4404, path


def test_a_socket_without_origin_does_not_use_the_session_cookie(server, alice, org_a):  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(alice)
    cookie = {"Cookie": f"sessionid={client.cookies['sessionid'].value}"}
    for path in _route_paths():
        # From the page of Sandpit's own origin the session authenticates (then: no sandbox).
        with _open(server, path, server.origin, cookie) as ws:
            assert _close_code(ws) == 4404, path
        # Without Origin only explicit credentials count: the cookie alone is not enough.
        with _open(server, path, None, cookie) as ws:
            assert _close_code(ws) == 4401, path


def test_a_program_without_origin_still_authenticates_with_its_key(server, key_a):  # type: ignore[no-untyped-def]
    for path in _route_paths():
        with _open(server, path, None, {"Authorization": f"Bearer {key_a}"}) as ws:
            assert _close_code(ws) == 4404, path


# --- In process: what decides the server's own origin -----------------------------------------


def _handshake(path: str, headers: dict[str, str], scheme: str = "ws") -> bool:
    """Whether the Origin check lets the handshake through (authentication comes after)."""

    async def run() -> bool:
        from playground.asgi import application

        communicator = WebsocketCommunicator(
            application, path, headers=[(k.encode(), v.encode()) for k, v in headers.items()]
        )
        communicator.scope["scheme"] = scheme
        accepted, _ = await communicator.connect(timeout=10)
        await communicator.disconnect()
        return accepted

    return async_to_sync(run)()


@pytest.mark.parametrize("path", _route_paths())
def test_the_scheme_behind_a_proxy_comes_from_secure_proxy_ssl_header(path, settings):  # type: ignore[no-untyped-def]
    host = {"host": "sandpit.example.com"}
    settings.ALLOWED_HOSTS = ["sandpit.example.com"]
    settings.SECURE_PROXY_SSL_HEADER = None
    # Without the setting the header is not trusted: the socket arrived as plain ws.
    assert _handshake(path, {**host, "origin": "http://sandpit.example.com"})
    assert not _handshake(
        path, {**host, "origin": "https://sandpit.example.com", "x-forwarded-proto": "https"}
    )
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    tls = {**host, "x-forwarded-proto": "https"}
    assert _handshake(path, {**tls, "origin": "https://sandpit.example.com"})
    assert _handshake(path, {**tls, "origin": "https://sandpit.example.com:443"})
    assert not _handshake(path, {**tls, "origin": "http://sandpit.example.com"})
    assert not _handshake(path, {**tls, "origin": "https://sandpit.example.com:8443"})
    # A wss socket is https without any proxy header.
    assert _handshake(path, {**host, "origin": "https://sandpit.example.com"}, scheme="wss")
    assert not _handshake(path, {**host, "origin": "http://sandpit.example.com"}, scheme="wss")


@pytest.mark.parametrize("path", _route_paths())
def test_trusted_origins_match_scheme_host_and_port(path, settings):  # type: ignore[no-untyped-def]
    settings.ALLOWED_HOSTS = ["sandpit.example.com"]
    settings.CSRF_TRUSTED_ORIGINS = ["https://app.example.net:8443", "https://*.example.org"]
    host = {"host": "sandpit.example.com"}
    assert _handshake(path, {**host, "origin": "https://app.example.net:8443"})
    assert not _handshake(path, {**host, "origin": "https://app.example.net"})
    assert not _handshake(path, {**host, "origin": "http://app.example.net:8443"})
    assert _handshake(path, {**host, "origin": "https://ide.example.org"})
    assert _handshake(path, {**host, "origin": "https://example.org"})
    assert not _handshake(path, {**host, "origin": "http://ide.example.org"})
    assert not _handshake(path, {**host, "origin": "https://ide.example.org:8443"})
    assert not _handshake(path, {**host, "origin": "https://evilexample.org"})


@pytest.mark.parametrize("path", _route_paths())
def test_a_host_outside_allowed_hosts_is_no_origin_of_ours(path, settings):  # type: ignore[no-untyped-def]
    settings.ALLOWED_HOSTS = ["sandpit.example.com"]
    assert _handshake(path, {"host": "sandpit.example.com", "origin": "http://sandpit.example.com"})
    assert not _handshake(path, {"host": "evil.example", "origin": "http://evil.example"})
