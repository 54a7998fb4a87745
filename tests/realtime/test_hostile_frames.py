"""Hostile frames on the three sockets (a terminal, streaming exec, sandbox events), on the
live server: each is answered with an error frame in the one shape, or ignored, and the
socket goes on (a ping still gets its pong). Never a closed socket, never a server fault:
a number JSON reads as infinity or NaN, nesting past Python's recursion limit, a lone
surrogate, types where objects go."""

from __future__ import annotations

import json
import random
import time
from typing import Any

import pytest
import websockets.sync.connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.sync.client import ClientConnection

from .conftest import open_terminal

pytestmark = pytest.mark.django_db(transaction=True)

COMMON = [
    "[" * 5000 + "]" * 5000,
    '{"type": ' * 3000 + "1" + "}" * 3000,
    "null",
    '"ping"',
    "[]",
    '{"type": 5}',
    '{"type": null}',
    '{"type": "\\ud800"}',
    "{" + '"type": "x", ' * 2 + '"pad": "' + "é" * 100_000 + '"}',
    b"\x00\xff binary",
]
PER_SOCKET = {
    "terminal": [
        '{"type": "resize", "cols": 1e999, "rows": 24}',
        '{"type": "resize", "cols": NaN, "rows": 24}',
        '{"type": "resize", "cols": -Infinity, "rows": 24}',
        '{"type": "resize", "cols": "9' + "9" * 5000 + '", "rows": 24}',
        '{"type": "resize", "cols": [80], "rows": {}}',
        '{"type": "input", "data": "\\ud800"}',
        '{"type": "input", "data": 5}',
    ],
    "exec": [
        '{"type": "run", "command": "true", "timeout_s": 1e999}',
        '{"type": "run", "command": "true", "timeout_s": NaN}',
        '{"type": "run", "command": "true", "timeout_s": -5}',
        '{"type": "run", "command": "true", "timeout_s": "soon"}',
        '{"type": "run", "command": "true", "env": {"A=B": "1"}}',
        '{"type": "run", "command": "true", "env": {"A\\u0000": "1"}}',
        '{"type": "run", "command": "true", "env": [1, 2]}',
        '{"type": "run", "command": ["true"], "args": "x"}',
        '{"type": "run", "id": {"a": 1}, "command": "true"}',
        '{"type": "stdin", "id": [], "data": "x"}',
        '{"type": "signal", "id": "nope", "signal": 1e999}',
    ],
    "events": [
        '{"type": "watch", "path": ".", "debounce_ms": 1e999}',
        '{"type": "watch", "path": ".", "debounce_ms": NaN}',
        '{"type": "watch", "path": {"a": 1}}',
        '{"type": "watch", "path": ".", "ignore": 5}',
        '{"type": "watch", "path": "\\u0000"}',
        '{"type": "unwatch", "id": [1]}',
    ],
}


def _until_pong(ws: ClientConnection, timeout: float = 15.0) -> list[dict[str, Any]]:
    """Send a ping; the JSON frames up to its pong (AssertionError if the socket closed)."""
    ws.send('{"type": "ping"}')
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while True:
        frame = ws.recv(timeout=max(0.1, deadline - time.monotonic()))
        if isinstance(frame, bytes):
            continue  # terminal output
        message = json.loads(frame)
        if message.get("type") == "pong":
            return seen
        seen.append(message)


def _assert_no_traceback_since(server: Any, offset: int) -> None:
    """No consumer's traceback in the server's log since `offset` (the server is shared by
    this worker's tests, whose background work may log its own)."""
    with server.log.open("rb") as log:
        log.seek(offset)
        written = log.read().decode(errors="replace")
    for trace in written.split("Traceback (most recent call last):")[1:]:
        frames = "\n".join(trace.splitlines()[:60])
        assert "/realtime/" not in frames and "channels/" not in frames, frames


def _socket(
    server: Any, key: str, api: Any, sandbox_id: str, which: str, **options: Any
) -> ClientConnection:
    if which == "terminal":
        return server.ws(open_terminal(api, sandbox_id)["ws_path"], key=key, **options)
    return server.ws(f"/ws/sandboxes/{sandbox_id}/{which}", key=key, **options)


@pytest.mark.parametrize("which", ["terminal", "exec", "events"])
def test_hostile_frames_get_an_error_and_the_socket_goes_on(server, rt_api_a, key_a, sbx_a, which):  # type: ignore[no-untyped-def]
    log_from = server.log.stat().st_size
    with _socket(server, key_a, rt_api_a, sbx_a, which) as ws:
        _until_pong(ws)
        for frame in [*COMMON, *PER_SOCKET[which]]:
            ws.send(frame)
            for message in _until_pong(ws):
                if message.get("type") == "error":
                    assert set(message) >= {"code", "message"}, (frame[:80], message)
                    assert message["code"] not in ("internal_error", "server_error"), message
                    assert "Traceback" not in message["message"]
        if which == "exec":
            # The socket still runs commands after all that.
            ws.send('{"type": "run", "id": "ok", "command": "echo fine"}')
            while True:
                message = json.loads(ws.recv(timeout=15))
                if message.get("type") == "exit" and message.get("id") == "ok":
                    assert message["code"] == 0
                    break
    _assert_no_traceback_since(server, log_from)


FIELDS = {
    "terminal": (["input", "resize", "ping"], ["data", "cols", "rows"]),
    "exec": (
        ["run", "attach", "stdin", "stdin_close", "signal", "cancel"],
        ["id", "command", "args", "code", "language", "env", "timeout_s", "data", "eof", "signal"],
    ),
    "events": (
        ["watch", "unwatch"],
        ["id", "path", "recursive", "ignore", "debounce_ms", "resume"],
    ),
}
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _messages(which: str) -> st.SearchStrategy[dict[str, Any]]:
    kinds, fields = FIELDS[which]
    return st.builds(
        lambda kind, extra: {**extra, "type": kind},
        st.sampled_from(kinds) | st.text(max_size=10),
        st.dictionaries(st.sampled_from(fields), JSON_VALUES, max_size=len(fields)),
    )


@pytest.mark.parametrize("which", ["terminal", "exec", "events"])
def test_generated_messages_never_break_the_socket(  # type: ignore[no-untyped-def]
    server, rt_api_a, key_a, sbx_a, which, monkeypatch
):
    """Hypothesis-generated messages of each socket's own types and fields, with values of
    any JSON type, in batches of ten then a ping: the socket answers every batch."""
    log_from = server.log.stat().st_size
    # Every websocket client's keepalive thread in this process (this test's, and any an
    # earlier test in the same worker left open) draws its ping data from the `random`
    # module; a ping falling while Hypothesis draws a batch reads to it as the strategy
    # using `random`. Their draws go to a generator of their own for this test.
    monkeypatch.setattr(websockets.sync.connection, "random", random.Random())
    with _socket(server, key_a, rt_api_a, sbx_a, which, ping_interval=None) as ws:
        _until_pong(ws)

        @given(batch=st.lists(_messages(which), min_size=10, max_size=10))
        @settings(
            max_examples=8,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def send(batch: list[dict[str, Any]]) -> None:
            for message in batch:
                ws.send(json.dumps(message))
            for answer in _until_pong(ws, timeout=30):
                if answer.get("type") == "error":
                    assert {"code", "message"} <= set(answer), answer

        send()
    _assert_no_traceback_since(server, log_from)
