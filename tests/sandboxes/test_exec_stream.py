"""exec_stream: a command's output as it is written, stdin, signals, timeout, close.

Runs on every provider of the contract suite's `provider` fixture that has it.
"""

from __future__ import annotations

import select
import signal
import time

import pytest

from sandboxes.providers.base import ExecEvent, ExecRequest, ExecStream, SandboxProvider


def drain(stream: ExecStream, until: str = "exit", timeout_s: float = 15.0) -> list[ExecEvent]:
    """Events until one of type `until` arrives (a marker, never a sleep)."""
    events: list[ExecEvent] = []
    deadline = time.monotonic() + timeout_s
    while not any(e.type == until for e in events):
        remaining = deadline - time.monotonic()
        assert remaining > 0, events
        select.select([stream.fileno()], [], [], remaining)
        try:
            events.extend(stream.read_events())
        except BlockingIOError:
            continue
    return events


def out(events: list[ExecEvent], kind: str) -> bytes:
    return b"".join(e.data for e in events if e.type == kind)


@pytest.fixture(autouse=True)
def _has_exec_stream(provider: SandboxProvider) -> None:
    # Every provider of the `provider` fixture streams (the cloud adapters, which do not,
    # are not among them): a provider that lost it is a failure, not a skip.
    assert hasattr(provider, "exec_stream"), f"{provider.name} has no exec_stream"


def test_streams_stdout_and_stderr_apart_and_ends_with_the_exit_code(provider, sandbox):  # type: ignore[no-untyped-def]
    stream = provider.exec_stream(sandbox, ExecRequest(command="echo out; echo err >&2; exit 3"))
    try:
        events = drain(stream)
    finally:
        stream.close()
    assert out(events, "stdout") == b"out\n"
    assert out(events, "stderr") == b"err\n"
    assert events[-1].type == "exit" and events[-1].exit_code == 3
    assert stream.read_events() == []


def test_output_arrives_before_the_command_ends(provider, sandbox):  # type: ignore[no-untyped-def]
    stream = provider.exec_stream(sandbox, ExecRequest(command="echo first; exec cat"))
    try:
        first = drain(stream, until="stdout")
        assert out(first, "stdout") == b"first\n"  # cat is still waiting for its stdin
        stream.write_stdin(b"typed\n")
        echoed: list[ExecEvent] = []
        while out(echoed, "stdout") != b"typed\n":
            echoed += drain(stream, until="stdout")
        stream.close_stdin()
        assert drain(stream)[-1].exit_code == 0
    finally:
        stream.close()


def test_initial_stdin_signal_and_timeout(provider, sandbox):  # type: ignore[no-untyped-def]
    stream = provider.exec_stream(sandbox, ExecRequest(command="cat", stdin=b"given\n"))
    try:
        assert out(drain(stream, until="stdout"), "stdout") == b"given\n"
        stream.signal(signal.SIGTERM)
        assert drain(stream)[-1].exit_code == -signal.SIGTERM
    finally:
        stream.close()
    stream = provider.exec_stream(sandbox, ExecRequest(command="sleep 60", timeout_s=0.5))
    try:
        last = drain(stream)[-1]
    finally:
        stream.close()
    assert last.timed_out and last.exit_code == -9


def test_close_kills_the_command_tree(provider, sandbox):  # type: ignore[no-untyped-def]
    stream = provider.exec_stream(sandbox, ExecRequest(command="sleep 311 & echo up; wait"))
    drain(stream, until="stdout")
    stream.close()
    deadline = time.monotonic() + 10
    while b"sleep 311" in provider.exec(sandbox, ExecRequest(command="ps -eo args")).stdout:
        assert time.monotonic() < deadline, "the command outlived its stream"
        time.sleep(0.05)
