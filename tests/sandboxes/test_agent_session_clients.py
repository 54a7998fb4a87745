"""A session's clients in the real agent (a local sandbox): one that goes away while the
agent is writing output to it is dropped, and the session's thread then waits quietly for
what comes next instead of spinning on the dropped client's closed socket."""

from __future__ import annotations

import socket
import struct
import time
import uuid

from sandboxes import agent_sessions
from sandboxes.providers.base import ExecRequest, SandboxProvider, SandboxSpec
from tests.requirements import missing_part

# Output starts once the first client is attached, outgrows what its socket holds, then the
# session stays alive, idle, for the measurement.
FLOOD_THEN_IDLE = "sleep 0.5; head -c 8000000 /dev/zero; sleep 6"
BUSY_FOR_A_FEW_SECONDS = "end=$(($(date +%s) + 3)); while [ $(date +%s) -lt $end ]; do :; done"


def _cpu_percent_over(provider: SandboxProvider, provider_id: str, seconds: float) -> float:
    provider.stats(provider_id)  # the sample the next one is measured from
    time.sleep(seconds)
    return provider.stats(provider_id).cpu_percent


def test_a_client_gone_while_output_is_written_to_it_leaves_the_session_idle(
    local_provider,  # type: ignore[no-untyped-def]
) -> None:
    handle = local_provider.create(SandboxSpec(sandbox_id=uuid.uuid4().hex))
    sandbox = handle.provider_id
    try:
        # The measure sees a busy sandbox (else an idle reading would prove nothing).
        local_provider.stats(sandbox)
        local_provider.exec(sandbox, ExecRequest(BUSY_FOR_A_FEW_SECONDS))
        busy = local_provider.stats(sandbox).cpu_percent
        if busy == 0.0:
            missing_part("the local provider reads no CPU use here (no cpuacct cgroup)")
        assert busy > 30, busy

        info, link = agent_sessions.session_open(
            local_provider, sandbox, kind="exec", argv=["sh", "-c", FLOOD_THEN_IDLE],
            cwd=None, env={}, attach=True,
        )  # fmt: skip
        assert link is not None
        # Not read: the agent's writes to it block once its socket is full...
        time.sleep(1.5)
        # ...until it resets the connection, which fails the write under way.
        link.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        link.close()
        time.sleep(1.0)  # the rest of the output, into the session's buffer alone
        idle = _cpu_percent_over(local_provider, sandbox, 2.0)
        assert idle < 20, f"the sandbox used {idle:.0f}% of a CPU while its session idled"

        # The session still serves a new client: its buffered output and its end.
        later = agent_sessions.session_attach(local_provider, sandbox, info.id, since=0)
        later.close()
        assert agent_sessions.session_get(local_provider, sandbox, info.id).running
        ended = agent_sessions.session_kill(local_provider, sandbox, info.id)
        assert not ended.running
    finally:
        local_provider.destroy(sandbox)


# Output all the time (the agent writes each piece to every client as it comes), while the
# run's input stays open until a client closes it.
FLOOD_UNTIL_STDIN_CLOSES = "yes & cat >/dev/null; kill $!"


def test_a_frame_a_client_sent_just_before_it_went_is_not_lost_to_output_due_to_it(
    provider: SandboxProvider, sandbox: str
) -> None:
    """A client that hands the session one frame and closes its link (a close of stdin, a
    signal, keystrokes from another web process: sandboxes/streaming.py sandbox_session_send)
    is gone when output is next written to it. The agent dropped it there, before reading
    the frame it had sent, so a close of stdin could be lost and the run wait forever; so
    could docker's exec relay, which closed the exec once output could not be delivered."""
    for _ in range(5):
        info, _ = agent_sessions.session_open(
            provider, sandbox, kind="exec", argv=["sh", "-c", FLOOD_UNTIL_STDIN_CLOSES],
            cwd=None, env={},
        )  # fmt: skip
        link = agent_sessions.session_attach(provider, sandbox, info.id, since=1 << 62)
        link.sock.setblocking(True)
        link.sock.sendall(agent_sessions.frame(b"C"))
        link.close()
        deadline = time.monotonic() + 10
        while agent_sessions.session_get(provider, sandbox, info.id).running:
            assert time.monotonic() < deadline, "the run never saw its input closed"
            time.sleep(0.05)
