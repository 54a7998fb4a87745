"""Streaming execution over /ws/sandboxes/<id>/exec."""

from __future__ import annotations

import json
import time

import pytest

from .conftest import create_sandbox, recv_json

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


def _run_all(server, key: str, sandbox_id: str, runs: list[tuple[str, str, str, int]]) -> list[str]:  # type: ignore[no-untyped-def]
    """Run `runs` (id, command, expected stdout, expected code) on one socket, up to the
    socket's limit of concurrent runs at a time; the mismatches, as text."""
    from sandboxes.realtime.exec import MAX_RUNS_PER_SOCKET

    expected = {run_id: (command, out, code) for run_id, command, out, code in runs}
    waiting = list(runs)
    results: dict[str, dict] = {}
    in_flight = 0
    with server.ws(f"/ws/sandboxes/{sandbox_id}/exec", key=key) as ws:
        while waiting or in_flight:
            while waiting and in_flight < MAX_RUNS_PER_SOCKET:
                run_id, command, _, _ = waiting.pop(0)
                ws.send(json.dumps({"type": "run", "id": run_id, "command": command}))
                # What a client that has no input says at once (the e2b layer does): it
                # reaches the run while or after the command ends.
                ws.send(json.dumps({"type": "stdin_close", "id": run_id}))
                results[run_id] = {"stdout": "", "exit": None}
                in_flight += 1
            message = json.loads(ws.recv(timeout=30))
            if message["type"] == "error" and message.get("code") != "run_not_found":
                raise AssertionError(message)
            result = results.get(message.get("id", ""))
            if result is None:
                continue
            if message["type"] == "stdout":
                result["stdout"] += message["data"]
            elif message["type"] == "exit":
                result["exit"] = message
                in_flight -= 1
    wrong = []
    for run_id, (command, out, code) in expected.items():
        got = results[run_id]
        if got["exit"]["code"] != code or got["stdout"] != out:
            wrong.append(f"{command!r}: code {got['exit']['code']}, stdout {got['stdout']!r}")
    return wrong


@pytest.fixture(params=["local", pytest.param("docker", marks=pytest.mark.docker)])
def any_sbx(request, server, rt_api_a):  # type: ignore[no-untyped-def]
    """A sandbox on each provider (docker where an engine runs)."""
    if request.param == "docker":
        from django.conf import settings

        from tests.docker_support import docker_provider_or_skip
        from tests.requirements import missing_part

        if "docker" not in settings.SANDPIT_PROVIDERS:
            missing_part("SANDPIT_PROVIDERS does not enable docker")
        docker_provider_or_skip()
    sandbox_id = create_sandbox(rt_api_a, provider=request.param)
    yield sandbox_id
    rt_api_a.delete(f"/api/v1/sandboxes/{sandbox_id}")


def test_fast_commands_all_report_their_exit_code_and_output(server, key_a, any_sbx):  # type: ignore[no-untyped-def]
    """A command that ends at once must not end its stream before its exit status (nor its
    output): 100 of them back to back on one socket, then 8 sockets of 25 at once."""
    import concurrent.futures

    def batch(prefix: str, n: int) -> list[tuple[str, str, str, int]]:
        runs = []
        for i in range(n):
            if i % 3 == 0:
                runs.append((f"{prefix}{i}", "true", "", 0))
            elif i % 3 == 1:
                runs.append((f"{prefix}{i}", f"echo x{i}", f"x{i}\n", 0))
            else:
                runs.append((f"{prefix}{i}", f"echo y{i}; exit {i % 7 + 1}", f"y{i}\n", i % 7 + 1))
        return runs

    assert _run_all(server, key_a, any_sbx, batch("a", 100)) == []
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        wrongs = list(
            pool.map(lambda p: _run_all(server, key_a, any_sbx, batch(p, 25)), "bcdefghi")
        )
    assert wrongs == [[]] * 8
