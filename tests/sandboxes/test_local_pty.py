"""Local terminals: the agent passes the PTY master to the host, the shell stays in the jail.

Real bubblewrap, no mocks. Uses the session `local_provider` from
tests/sandboxes/conftest.py.
"""

from __future__ import annotations

import json
import os
import select
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandboxes.providers import agent_client as wire
from sandboxes.providers.agent_client import AgentPtySession, AgentRelayPtySession
from sandboxes.providers.base import ExecRequest, ProviderError, SandboxGone, SandboxSpec
from tests.sandboxes.test_provider_contract import PROMPT, read_pty_until

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 10.0


@pytest.fixture
def sandbox(local_provider) -> Iterator[str]:  # type: ignore[no-untyped-def]
    handle = local_provider.create(SandboxSpec(sandbox_id=uuid.uuid4().hex))
    yield handle.provider_id
    local_provider.destroy(handle.provider_id)


@pytest.fixture
def term(local_provider, sandbox) -> Iterator[AgentPtySession]:  # type: ignore[no-untyped-def]
    session = local_provider.open_pty(sandbox, cols=80, rows=24)
    yield session
    session.close()


def read_until(pty: object, needle: bytes, timeout: float = DEADLINE_S) -> bytes:
    seen = b""
    end = time.monotonic() + timeout
    while needle not in seen:
        remaining = end - time.monotonic()
        if remaining <= 0:
            pytest.fail(f"{needle!r} not seen in terminal output {seen[-500:]!r}")
        select.select([pty.fileno()], [], [], min(remaining, 0.5))  # type: ignore[attr-defined]
        try:
            chunk = pty.read()  # type: ignore[attr-defined]
        except BlockingIOError:
            continue
        if chunk == b"":
            pytest.fail(f"terminal ended before {needle!r}: {seen[-500:]!r}")
        seen += chunk
    return seen


def wait_for(fn: Callable[[], object], timeout: float = DEADLINE_S) -> object:
    end = time.monotonic() + timeout
    while not (value := fn()):
        if time.monotonic() > end:
            pytest.fail(f"condition not met within {timeout}s")
        time.sleep(0.05)
    return value


def jail_processes(provider, sandbox: str) -> str:  # type: ignore[no-untyped-def]
    result = provider.exec(sandbox, ExecRequest(command="ps -eo pid,stat,args"))
    assert result.exit_code == 0, result.stderr
    return result.stdout.decode()


def own_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


# ---------------------------------------------------------------------------
# the descriptor the host holds
# ---------------------------------------------------------------------------


def test_the_host_holds_the_pty_master_close_on_exec(term):
    assert isinstance(term, AgentPtySession)
    fd = term.fileno()
    assert os.isatty(fd)
    assert not os.get_inheritable(fd)  # never reaches the host's children
    assert not os.get_blocking(fd)
    wire.check_pty_master(fd)  # a master, not a slave


def test_echo_round_trip(term):
    term.write(b"echo h$((1))i\n")
    read_until(term, b"h1i")
    assert term.exit_code() is None


def test_resize_is_visible_inside(term):
    term.write(b"stty size\n")
    # Resized at the prompt: readline rewrites the window size it read as it prepares the
    # terminal for a line, undoing a resize landing in between (test_provider_contract.py).
    read_pty_until(term, PROMPT, after=b"24 80")
    term.resize(cols=123, rows=45)
    term.write(b"stty size\n")
    read_until(term, b"45 123")


def test_resize_signals_the_foreground_process(term):
    term.write(b"trap 'echo WIN$((6*7))' WINCH; echo armed-$((1+1)); sleep 30 & wait\n")
    read_until(term, b"armed-2")  # the trap is set
    term.resize(cols=90, rows=30)
    read_until(term, b"WIN42")


def test_ctrl_c_interrupts_sleep(term):
    # The marker prints from the foreground job itself, so ^C cannot race the shell's fork.
    term.write(b"sh -c 'echo running-$((6*7)); exec sleep 100'; echo not-$((0))-interrupted\n")
    read_until(term, b"running-42")
    started = time.monotonic()
    term.write(b"\x03")
    term.write(b"echo after$((2+3))\n")
    out = read_until(term, b"after5")
    assert time.monotonic() - started < 5
    assert b"not-0-interrupted" not in out


def test_exit_code_is_reported(term):
    term.write(b"exit 3\n")
    wait_for(lambda: term.exit_code() is not None)
    assert term.exit_code() == 3
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end:  # and the stream ends
        select.select([term.fileno()], [], [], 0.5)
        try:
            if term.read() == b"":
                break
        except BlockingIOError:
            continue
    else:
        pytest.fail("the stream did not end after exit")
    term.close()
    assert term.exit_code() == 3


def test_close_kills_the_process_tree(local_provider, sandbox):
    session = local_provider.open_pty(sandbox)
    session.write(b"sleep 1000 & sleep 1001 | cat & echo started-$((7*6))\n")
    read_until(session, b"started-42")
    assert "sleep 1000" in jail_processes(local_provider, sandbox)
    session.close()
    # close() returns once the agent confirmed the kill; allow for the reaper anyway
    wait_for(lambda: "sleep 10" not in jail_processes(local_provider, sandbox))
    assert session.exit_code() == -9
    assert session.read() == b""
    with pytest.raises(SandboxGone):
        session.write(b"x")
    with pytest.raises(SandboxGone):
        session.resize(10, 10)
    session.close()  # idempotent


def test_the_shell_runs_inside_the_jail(term):
    secret = REPO / "manage.py"
    assert secret.exists()
    term.write(
        f"echo H=$(hostname) U=$(id -u) P=$$; test -e {secret} && echo SEEN || echo HID; "
        "echo DONE$((5*5))\n".encode()
    )
    out = read_until(term, b"DONE25")
    out = out[out.index(b"\n", out.rindex(b"DONE$((5*5))")) :]  # past the echoed input
    assert b"H=sandbox" in out
    assert b"U=0" not in out
    assert b"HID" in out and b"SEEN" not in out
    # the shell's pid is one of the jail's PID namespace, not the host's
    pid = int(out.split(b"P=")[-1].split()[0])
    assert pid == term.pid
    assert pid < 1000


def test_destroy_ends_the_stream(local_provider):
    handle = local_provider.create(SandboxSpec(sandbox_id=uuid.uuid4().hex))
    session = local_provider.open_pty(handle.provider_id)
    try:
        session.write(b"echo ready$((1+1))\n")
        read_until(session, b"ready2")
        local_provider.destroy(handle.provider_id)
        end = time.monotonic() + DEADLINE_S
        while True:
            assert time.monotonic() < end, "the stream did not end"
            select.select([session.fileno()], [], [], 0.5)
            try:
                if session.read() == b"":
                    break
            except BlockingIOError:
                continue
            except SandboxGone:
                break
        assert session.exit_code() == -9
    finally:
        session.close()


def test_no_descriptor_leaks(local_provider, sandbox):
    before = own_fds()
    for _ in range(5):
        session = local_provider.open_pty(sandbox)
        session.write(b"echo x\n")
        read_until(session, b"x")
        session.close()
    assert own_fds() == before


# ---------------------------------------------------------------------------
# the fallback relay and a hostile agent
# ---------------------------------------------------------------------------


def test_the_relay_still_works_without_fd_passing(local_provider, sandbox):
    """An agent that cannot pass the descriptor relays the bytes (the old path)."""
    sock = local_provider._connect(sandbox, timeout=5.0)
    request = {"op": "pty", "argv": ["/bin/bash"], "cols": 80, "rows": 24, "env": {}}
    sock.sendall(json.dumps(request).encode() + b"\n")
    reply, fd = wire.pty_reply(sock)
    assert fd is None and reply["mode"] == "relay"
    sock.setblocking(False)
    session = AgentRelayPtySession(
        lambda req: local_provider._call(sandbox, req), sock, int(reply["pid"])
    )
    try:
        session.write(b"echo r$((4+4))\n")
        read_until(session, b"r8")
        session.resize(cols=101, rows=33)
        session.write(b"stty size; exit 4\n")
        read_until(session, b"33 101")
        wait_for(lambda: session.exit_code() is not None)
        assert session.exit_code() == 4
    finally:
        session.close()


def _send_reply(sock: socket.socket, fds: list[int], body: bytes = b'{"ok": true, "pid": 2}\n'):
    socket.send_fds(sock, [body], fds)


def test_the_host_refuses_a_descriptor_that_is_not_a_pty_master():
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    master, slave = os.openpty()
    pipe_r, pipe_w = os.pipe()
    try:
        for bad in (pipe_r, slave, theirs.fileno()):
            before = own_fds()
            _send_reply(theirs, [bad])
            with pytest.raises(ProviderError):
                wire.pty_reply(ours)
            assert own_fds() == before  # the received copy was closed
        before = own_fds()
        _send_reply(theirs, [master, master])  # exactly one descriptor, no more
        with pytest.raises(ProviderError):
            wire.pty_reply(ours)
        assert own_fds() == before
        _send_reply(theirs, [master], b'{"ok": false, "error": "invalid_request"}\n')
        with pytest.raises(ProviderError):
            wire.pty_reply(ours)
        assert own_fds() == before
        _send_reply(theirs, [master])
        reply, fd = wire.pty_reply(ours)
        assert reply["pid"] == 2 and fd is not None
        assert not os.get_inheritable(fd)
        os.close(fd)
    finally:
        for fd in (master, slave, pipe_r, pipe_w):
            os.close(fd)
        ours.close()
        theirs.close()
