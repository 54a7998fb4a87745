"""The retry policy, against a scripted HTTP server on loopback: which answers are retried,
that a retried write keeps its Idempotency-Key, and that Retry-After is honoured but bounded."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from sandpit import LimitError, RateLimitError, RetryPolicy, SandboxError, Sandpit


class Script:
    def __init__(self) -> None:
        self.answers: list[tuple[int, dict[str, str], dict]] = []
        self.seen: list[tuple[str, str, dict[str, str]]] = []


@pytest.fixture
def scripted() -> Iterator[tuple[str, Script]]:
    script = Script()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            script.seen.append((self.command, self.path, dict(self.headers)))
            status, headers, body = script.answers.pop(0)
            data = json.dumps(body).encode()
            self.send_response(status)
            for name, value in {**headers, "Content-Type": "application/json"}.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = _answer

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", script
    httpd.shutdown()


def error(code: str) -> dict:
    return {"error": {"code": code, "message": code}}


SANDBOX = {
    "id": "sbx_1",
    "state": "running",
    "provider": "local",
    "template": "default",
    "timeout_s": 900,
    "network": False,
}
FAST = RetryPolicy(backoff_s=0.001)


def test_write_is_retried_with_the_same_idempotency_key(scripted):  # type: ignore[no-untyped-def]
    url, script = scripted
    script.answers = [
        (502, {}, error("provider_error")),
        (503, {}, error("provider_unavailable")),
        (201, {}, SANDBOX),
    ]
    with Sandpit("sp_key", url, retry=FAST) as client:
        assert client.create().id == "sbx_1"
    keys = {headers.get("Idempotency-Key") for _, _, headers in script.seen}
    assert len(script.seen) == 3 and len(keys) == 1 and None not in keys


def test_each_write_gets_its_own_key(scripted):  # type: ignore[no-untyped-def]
    url, script = scripted
    script.answers = [(201, {}, SANDBOX), (201, {}, SANDBOX)]
    with Sandpit("sp_key", url, retry=FAST) as client:
        client.create()
        client.create()
    assert script.seen[0][2]["Idempotency-Key"] != script.seen[1][2]["Idempotency-Key"]


def test_rate_limit_waits_for_retry_after_then_succeeds(scripted):  # type: ignore[no-untyped-def]
    url, script = scripted
    script.answers = [(429, {"Retry-After": "0"}, error("rate_limited")), (200, {}, SANDBOX)]
    with Sandpit("sp_key", url, retry=FAST) as client:
        assert client.sandbox_info("sbx_1").state == "running"
    assert len(script.seen) == 2
    assert "Idempotency-Key" not in script.seen[0][2]  # reads carry none


def test_retry_after_beyond_the_bound_is_raised_at_once(scripted):  # type: ignore[no-untyped-def]
    url, script = scripted
    script.answers = [(429, {"Retry-After": "3600"}, error("rate_limited"))]
    with Sandpit("sp_key", url, retry=FAST) as client, pytest.raises(RateLimitError) as raised:
        client.sandbox_info("sbx_1")
    assert raised.value.retry_after_s == 3600 and len(script.seen) == 1


def test_quota_and_client_errors_are_not_retried(scripted):  # type: ignore[no-untyped-def]
    url, script = scripted
    script.answers = [(429, {}, error("sandbox_limit_reached")), (501, {}, error("not_supported"))]
    with Sandpit("sp_key", url, retry=FAST) as client:
        with pytest.raises(LimitError):
            client.create()
        with pytest.raises(SandboxError) as unsupported:
            client.sandbox_info("sbx_1")
    assert unsupported.value.status == 501
    assert len(script.seen) == 2


def test_gives_up_after_max_attempts(scripted):  # type: ignore[no-untyped-def]
    url, script = scripted
    script.answers = [(503, {}, error("provider_unavailable"))] * 4
    with Sandpit("sp_key", url, retry=FAST) as client, pytest.raises(SandboxError):
        client.sandbox_info("sbx_1")
    assert len(script.seen) == 4
