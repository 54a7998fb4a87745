"""RunnerExecStream: a streamed run on a provider without exec_stream (the runner on a PTY),
here on the local provider's real PTY, behaves as the ExecStream contract says."""

from __future__ import annotations

import select
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from sandboxes.providers.base import ExecEvent, ExecRequest, SandboxSpec
from sandboxes.streaming import RunnerExecStream

from .test_exec_stream import drain, out


@pytest.fixture
def jail(local_provider) -> Iterator[str]:  # type: ignore[no-untyped-def]
    handle = local_provider.create(SandboxSpec(sandbox_id=uuid.uuid4().hex))
    yield handle.provider_id
    local_provider.destroy(handle.provider_id)


def start(provider: Any, jail: str, command: str, **kw: Any) -> RunnerExecStream:
    return RunnerExecStream.open(
        provider,
        jail,
        argv=["sh", "-c", command],
        cwd=kw.get("cwd"),
        env=kw.get("env", {}),
        timeout_s=kw.get("timeout_s"),
    )


def test_output_apart_and_the_exit_code_last(local_provider, jail):  # type: ignore[no-untyped-def]
    stream = start(local_provider, jail, "echo out; echo err >&2; exit 3")
    try:
        assert stream.pid > 0
        events = drain(stream)
    finally:
        stream.close()
    assert out(events, "stdout") == b"out\n"
    assert out(events, "stderr") == b"err\n"
    assert events[-1] == ExecEvent("exit", exit_code=3)
    assert stream.read_events() == []


def test_input_after_the_command_ended_loses_nothing(local_provider, jail):  # type: ignore[no-untyped-def]
    """The lost exit status: input sent once the command (and the runner) had ended made
    the PTY write raise before the frames already read were handed on."""
    stream = start(local_provider, jail, "echo quick; exit 5")
    try:
        hangup = select.poll()
        hangup.register(stream.fileno(), 0)  # POLLHUP only: nothing holds the PTY any more
        deadline = time.monotonic() + 15
        while not hangup.poll(100):
            assert time.monotonic() < deadline, "the runner did not end"
        stream.write_stdin(b"late\n")
        stream.close_stdin()
        stream.signal(signal.SIGTERM)
        events = drain(stream)
    finally:
        stream.close()
    assert out(events, "stdout") == b"quick\n"
    assert events[-1] == ExecEvent("exit", exit_code=5)


def test_stdin_signal_and_timeout(local_provider, jail):  # type: ignore[no-untyped-def]
    stream = start(local_provider, jail, "echo first; exec cat")
    try:
        assert out(drain(stream, until="stdout"), "stdout") == b"first\n"
        stream.write_stdin(b"typed\n")
        assert out(drain(stream, until="stdout"), "stdout") == b"typed\n"
        stream.signal(signal.SIGTERM)
        assert drain(stream)[-1].exit_code == -signal.SIGTERM
    finally:
        stream.close()
    stream = start(local_provider, jail, "cat; exit 4")
    try:
        stream.close_stdin()
        assert drain(stream)[-1].exit_code == 4
    finally:
        stream.close()
    stream = start(local_provider, jail, "sleep 60", timeout_s=0.5)
    try:
        last = drain(stream)[-1]
    finally:
        stream.close()
    assert last.timed_out and last.exit_code == -9


def test_a_command_that_cannot_start_ends_with_127(local_provider, jail):  # type: ignore[no-untyped-def]
    stream = RunnerExecStream.open(
        local_provider, jail, argv=["/no/such/program"], cwd=None, env={}, timeout_s=None
    )
    try:
        events = drain(stream)
    finally:
        stream.close()
    assert b"No such file" in out(events, "stderr")
    assert events[-1].exit_code == 127


def test_close_kills_the_command_tree(local_provider, jail):  # type: ignore[no-untyped-def]
    stream = start(local_provider, jail, "sleep 312 & echo up; wait")
    drain(stream, until="stdout")
    stream.close()
    deadline = time.monotonic() + 10
    while b"sleep 312" in local_provider.exec(jail, ExecRequest(command="ps -eo args")).stdout:
        assert time.monotonic() < deadline, "the command outlived its stream"
        time.sleep(0.05)
