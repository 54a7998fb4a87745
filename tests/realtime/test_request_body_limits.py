"""Request bodies against the real web server (playground/webserver.py): an oversized
upload is refused as it arrives, in the one error shape, and the server's memory stays flat."""

from __future__ import annotations

import json
import select
import socket
from pathlib import Path

import pytest

from tests.realtime.conftest import Api, Server, create_sandbox

pytestmark = pytest.mark.django_db(transaction=True)

GIB = 1 << 30
MIB = 1 << 20
MAX_FILE_BYTES = 10 * MIB  # the server runs with the default SANDPIT_MAX_FILE_BYTES


def rss_bytes(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for pid {pid}")


def reset_peak(pid: int) -> int:
    """Reset the server's peak RSS (VmHWM) to its current RSS; returns that RSS."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return rss_bytes(pid, "VmRSS")


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    want = int(headers.get("content-length", "0"))
    while len(body) < want:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, headers, body


def send_body(sock: socket.socket, total: int, *, chunked: bool) -> int:
    """Send up to `total` body bytes as a client that watches for an early answer (as curl
    does); stops when the server answers or closes. Returns the bytes sent."""
    piece = b"x" * MIB
    sent = 0
    try:
        while sent < total:
            readable, writable, _ = select.select([sock], [sock], [], 30)
            if readable:
                return sent
            if not writable:
                raise AssertionError("the server neither read nor answered for 30 s")
            data = b"%x\r\n" % len(piece) + piece + b"\r\n" if chunked else piece
            sock.sendall(data)
            sent += len(piece)
        if chunked:
            sock.sendall(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass
    return sent


def put_request(server: Server, api: Api, sandbox_id: str, name: str, **headers: str) -> bytes:
    lines = [
        f"PUT /api/v1/sandboxes/{sandbox_id}/files/content?path={name} HTTP/1.1",
        f"Host: 127.0.0.1:{server.port}",
        f"Authorization: Bearer {api.key}",
        "Content-Type: application/octet-stream",
        *(f"{key.replace('_', '-')}: {value}" for key, value in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def assert_payload_too_large(status: int, headers: dict[str, str], body: bytes) -> None:
    assert status == 413, (status, body[:300])
    assert headers["content-type"] == "application/json"
    error = json.loads(body)["error"]
    assert error["code"] == "payload_too_large" and str(MAX_FILE_BYTES) in error["message"]


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_two_gib_upload_is_refused_with_flat_server_memory(server, rt_api_a, chunked):
    sandbox_id = create_sandbox(rt_api_a)
    rss_before = reset_peak(server.pid)
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        framing = {"Transfer_Encoding": "chunked"} if chunked else {"Content_Length": str(2 * GIB)}
        sock.sendall(put_request(server, rt_api_a, sandbox_id, "big.bin", **framing))
        if not chunked:
            # Refused from the header alone: the answer comes before any body byte is sent.
            assert_payload_too_large(*read_response(sock))
        sent = send_body(sock, 2 * GIB, chunked=chunked)
        if chunked:
            assert sent < 2 * GIB
            assert_payload_too_large(*read_response(sock))
    growth = rss_bytes(server.pid, "VmHWM") - rss_before
    assert growth < 64 * MIB, f"server peak RSS grew by {growth / MIB:.0f} MiB"
    listing = rt_api_a.get(f"/api/v1/sandboxes/{sandbox_id}/files").json()["entries"]
    assert listing == []


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_upload_at_the_limit_is_stored_and_one_byte_more_is_413(server, rt_api_a, chunked):
    sandbox_id = create_sandbox(rt_api_a)
    for size, expected in ((MAX_FILE_BYTES, 201), (MAX_FILE_BYTES + 1, 413)):
        with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
            framing = {"Transfer_Encoding": "chunked"} if chunked else {"Content_Length": str(size)}
            sock.sendall(put_request(server, rt_api_a, sandbox_id, f"f{size}", **framing))
            body = b"y" * size
            try:
                if chunked:
                    sock.sendall(b"%x\r\n" % size + body + b"\r\n0\r\n\r\n")
                elif expected == 201:
                    sock.sendall(body)
            except (BrokenPipeError, ConnectionResetError):
                assert expected == 413  # cut at the limit; the answer is still readable
            status, headers, answer = read_response(sock)
        if expected == 413:
            assert_payload_too_large(status, headers, answer)
        else:
            assert status == 201, answer[:300]
            assert json.loads(answer)["size"] == size


def test_json_body_over_its_limit_is_413_on_the_live_server(server, rt_api_a):
    sandbox_id = create_sandbox(rt_api_a)
    body = json.dumps({"command": "true", "stdin": "x" * (3 * MIB)})
    response = rt_api_a.post(
        f"/api/v1/sandboxes/{sandbox_id}/commands",
        content=body,
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 413, response.text[:300]
    assert response.json()["error"]["code"] == "payload_too_large"


def test_chunked_upload_with_an_idempotency_key_is_stored_once(server, rt_api_a):
    sandbox_id = create_sandbox(rt_api_a)
    answers = []
    for _ in range(2):
        with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
            head = put_request(
                server,
                rt_api_a,
                sandbox_id,
                "chunked.bin",
                Transfer_Encoding="chunked",
                Idempotency_Key="chunked-upload-1",
            )
            sock.sendall(head + b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
            answers.append(read_response(sock))
    (status, headers, body), (replay_status, replay_headers, replay_body) = answers
    assert status == 201, body[:300]
    assert json.loads(body)["size"] == len(b"hello world")
    assert (replay_status, replay_body) == (201, body)
    assert replay_headers.get("idempotent-replayed") == "true"
    content = rt_api_a.get(f"/api/v1/sandboxes/{sandbox_id}/files/content?path=chunked.bin")
    assert content.content == b"hello world"


@pytest.mark.parametrize(
    "content_type",
    ["multipart/form-data", "multipart/form-data; boundary=x", "application/x-www-form-urlencoded"],
)
def test_a_malformed_form_body_is_answered_in_the_api_error_shape(server, rt_api_a, content_type):
    """The web server leaves form and multipart bodies to the application: Twisted parsed
    them itself and answered a multipart one without a boundary with a bare 400, closing
    the connection, before the API could say what was wrong."""
    sandbox_id = create_sandbox(rt_api_a)
    response = rt_api_a.post(
        f"/api/v1/sandboxes/{sandbox_id}/commands",
        content=b'--x\r\nContent-Disposition: form-data; name="command"\r\n\r\ntrue',
        headers={"Content-Type": content_type},
    )
    assert response.headers["content-type"] == "application/json", response.text[:300]
    error = response.json()["error"]
    assert (response.status_code, error["code"]) == (415, "unsupported_media_type"), error
