"""Streaming execution over /ws/sandboxes/<id>/exec."""

from __future__ import annotations

import json
import time

import pytest

from .conftest import recv_json

pytestmark = pytest.mark.django_db(transaction=True)


def _collect(ws, run_id: str, timeout: float = 15.0) -> dict:  # type: ignore[no-untyped-def]
    out = {"stdout": "", "stderr": "", "exit": None, "started": None}
    deadline = time.monotonic() + timeout
    while out["exit"] is None:
        message = json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
        if message.get("id") != run_id:
            continue
        if message["type"] in ("stdout", "stderr"):
            out[message["type"]] += message["data"]
        elif message["type"] == "started":
            out["started"] = message
        elif message["type"] == "exit":
            out["exit"] = message
        elif message["type"] == "error":
            raise AssertionError(message)
    return out


def test_command_streams_stdout_stderr_stdin_and_exit_code(server, key_a, sbx_a):  # type: ignore[no-untyped-def]
    with server.ws(f"/ws/sandboxes/{sbx_a}/exec", key=key_a) as ws:
        ws.send(
            json.dumps(
                {
                    "type": "run",
                    "id": "r1",
                    "code": "import sys\nprint('out')\nprint('err', file=sys.stderr)\n"
                    "print('got ' + input())\nsys.exit(4)",
                    "language": "python",
                }
            )
        )
        assert recv_json(ws, "started")["id"] == "r1"
        ws.send(json.dumps({"type": "stdin", "id": "r1", "data": "héllo\n", "eof": True}))
        result = _collect(ws, "r1")
        assert result["stdout"] == "out\ngot héllo\n"
        assert result["stderr"] == "err\n"
        assert result["exit"]["code"] == 4


def test_cancel_kills_a_long_command(server, key_a, sbx_a):  # type: ignore[no-untyped-def]
    with server.ws(f"/ws/sandboxes/{sbx_a}/exec", key=key_a) as ws:
        ws.send(json.dumps({"type": "run", "id": "long", "command": "echo begin; sleep 100"}))
        assert recv_json(ws, "stdout")["data"] == "begin\n"
        started = time.monotonic()
        ws.send(json.dumps({"type": "cancel", "id": "long"}))
        exit_message = recv_json(ws, "exit")
        assert exit_message["cancelled"] is True and time.monotonic() - started < 3
        ws.send(json.dumps({"type": "run", "id": "t", "command": "sleep 5", "timeout_s": 0.5}))
        timed = recv_json(ws, "exit")
        assert timed["id"] == "t" and timed.get("timed_out") is True
