"""The port preview proxies WebSockets too: a server in the sandbox speaks to a client
through daphne, with the same credentials rules as the HTTP preview."""

from __future__ import annotations

import time

import httpx
import pytest
from websockets.exceptions import ConnectionClosed

pytestmark = pytest.mark.django_db(transaction=True)

# A WebSocket echo server in the standard library only (the sandbox has no packages): it
# first reports the request line's path, then echoes text and binary frames.
ECHO_SERVER = r"""
import base64, hashlib, socket, struct
GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", 8765))
srv.listen(8)

def recv_exact(c, n):
    data = b""
    while len(data) < n:
        chunk = c.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data

def send_frame(c, opcode, payload):
    n = len(payload)
    if n < 126:
        head = bytes([0x80 | opcode, n])
    elif n < 65536:
        head = bytes([0x80 | opcode, 126]) + struct.pack(">H", n)
    else:
        head = bytes([0x80 | opcode, 127]) + struct.pack(">Q", n)
    c.sendall(head + payload)

while True:
    c, _ = srv.accept()
    request = b""
    while b"\r\n\r\n" not in request:
        request += c.recv(4096)
    lines = request.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (l.split(":", 1) for l in lines[1:] if ":" in l)}
    digest = hashlib.sha1((headers["sec-websocket-key"] + GUID).encode()).digest()
    c.sendall(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Accept: " + base64.b64encode(digest) + b"\r\n\r\n"
    )
    send_frame(c, 1, ("path " + lines[0].split()[1]).encode())
    try:
        while True:
            b1, b2 = recv_exact(c, 2)
            opcode, n = b1 & 0x0F, b2 & 0x7F
            if n == 126:
                n = struct.unpack(">H", recv_exact(c, 2))[0]
            elif n == 127:
                n = struct.unpack(">Q", recv_exact(c, 8))[0]
            mask = recv_exact(c, 4) if b2 & 0x80 else b"\0\0\0\0"
            data = bytes(x ^ mask[i % 4] for i, x in enumerate(recv_exact(c, n)))
            if opcode == 8:
                send_frame(c, 8, data[:2])
                break
            send_frame(c, opcode, data)
    except EOFError:
        pass
    c.close()
"""


def _start_echo_server(api, sandbox_id: str) -> str:  # type: ignore[no-untyped-def]
    put = api.put(
        f"/api/v1/sandboxes/{sandbox_id}/files/content",
        params={"path": "ws_echo.py"},
        content=ECHO_SERVER.encode(),
    )
    assert put.status_code in (200, 201, 204), put.text
    started = api.post(
        f"/api/v1/sandboxes/{sandbox_id}/processes",
        json={"command": "python3", "args": ["ws_echo.py"]},
    )
    assert started.status_code in (200, 201), started.text
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        ports = api.get(f"/api/v1/sandboxes/{sandbox_id}/ports").json()["results"]
        if any(p["port"] == 8765 for p in ports):
            return f"/sandboxes/{sandbox_id}/ports/8765"
        time.sleep(0.2)
    raise AssertionError("the echo server never listened")


def test_websocket_preview_relays_text_and_binary_both_ways(server, rt_api_a, key_a, key_b, sbx_a):  # type: ignore[no-untyped-def]
    prefix = _start_echo_server(rt_api_a, sbx_a)

    ws = server.ws(f"{prefix}/echo?x=1", key=key_a)
    assert ws.recv(timeout=10) == "path /echo?x=1"
    ws.send("hello, sandbox")
    assert ws.recv(timeout=10) == "hello, sandbox"
    payload = bytes(range(256)) * 300  # binary, larger than one 64 KiB read
    ws.send(payload)
    assert ws.recv(timeout=10) == payload
    ws.close()

    # A sandbox token with the ports scope works from the query string, which the sandbox
    # never sees.
    token = rt_api_a.post(f"/api/v1/sandboxes/{sbx_a}/tokens", json={"scopes": ["ports"]}).json()[
        "token"
    ]
    with server.ws(f"{prefix}/?token={token}&y=2") as ws:
        assert ws.recv(timeout=10) == "path /?y=2"

    # No credentials, another organization's key, or a token without the scope: refused.
    terminal_token = rt_api_a.post(
        f"/api/v1/sandboxes/{sbx_a}/tokens", json={"scopes": ["terminal"]}
    ).json()["token"]
    for path, key, code in (
        (f"{prefix}/", None, 4401),
        (f"{prefix}/", key_b, 4404),
        (f"{prefix}/?token={terminal_token}", None, 4403),
    ):
        with server.ws(path, key=key) as ws, pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == code, path
    # The HTTP side of the same port is still the sandbox's, not a generic proxy.
    assert httpx.get(server.http + f"{prefix}/").status_code == 401
