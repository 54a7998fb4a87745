"""The host end of the agent's sessions against a hostile or broken agent (a socketpair
plays the agent: code in a sandbox can replace its agent, so nothing it sends is trusted)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from typing import Any

import pytest

from sandboxes import agent_sessions
from sandboxes.providers.base import ProcessNotFound, ProviderError


class FakeAgent:
    """agent_socket() hands out one end of a socketpair; the other end answers `replies`."""

    def __init__(self, *replies: bytes) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []
        self.connections = 0

    def agent_socket(self, provider_id: str) -> socket.socket:
        self.connections += 1
        ours, theirs = socket.socketpair()
        reply = self.replies.pop(0)

        def serve() -> None:
            data = b""
            while b"\n" not in data:
                data += theirs.recv(65536)
            self.requests.append(json.loads(data.split(b"\n")[0]))
            theirs.sendall(reply)
            theirs.shutdown(socket.SHUT_WR)

        threading.Thread(target=serve, daemon=True).start()
        return ours


def test_session_ids_are_checked_before_anything_reaches_the_agent():
    agent = FakeAgent()
    for bad in (
        "",
        "term_",
        "term_../x",
        "term_" + "0" * 15,
        "proc_" + "0" * 16,
        "term_" + "0" * 16 + "\n",
    ):
        with pytest.raises(ProcessNotFound):
            agent_sessions.session_attach(agent, "p", bad)
        with pytest.raises(ProcessNotFound):
            agent_sessions.session_kill(agent, "p", bad)
    assert agent.connections == 0


def test_a_malformed_session_from_the_agent_is_a_provider_error():
    row = {"id": "term_" + "a" * 16, "kind": "pty", "pid": "not a number"}
    agent = FakeAgent(json.dumps({"ok": True, "sessions": [row]}).encode() + b"\n")
    with pytest.raises(ProviderError, match="malformed"):
        agent_sessions.session_list(agent, "p")
    agent = FakeAgent(json.dumps({"ok": True, "sessions": "nope"}).encode() + b"\n")
    assert agent_sessions.session_list(agent, "p") == []
    agent = FakeAgent(b'{"ok": false, "error": "process_not_found", "message": "gone"}\n')
    with pytest.raises(ProcessNotFound):
        agent_sessions.session_get(agent, "p", "term_" + "b" * 16)


def test_env_names_and_nul_bytes_are_refused_before_the_agent():
    agent = FakeAgent()
    for env in ({"A=B": "x"}, {"": "x"}, {"A": "x\x00y"}):
        with pytest.raises(ProviderError):
            agent_sessions.session_open(
                agent, "p", kind="pty", argv=["/bin/bash"], cwd=None, env=env
            )
    assert agent.connections == 0


def _attached(*frames: bytes) -> tuple[FakeAgent, agent_sessions.SessionLink]:
    head = {"ok": True, "id": "term_" + "c" * 16, "kind": "pty", "pid": 7, "from": 100}
    agent = FakeAgent(json.dumps(head).encode() + b"\n" + b"".join(frames))
    return agent, agent_sessions.session_attach(agent, "p", "term_" + "c" * 16, since=100)


def test_frames_split_anywhere_arrive_whole_with_their_offset():
    frames = [agent_sessions.frame(b"O", b"hello "), agent_sessions.frame(b"O", b"world")]
    exit_frame = agent_sessions.frame(b"X", json.dumps({"exit_code": 3}).encode())
    _, link = _attached(*frames, exit_frame)
    got: list[bytes] = []
    ended: list[Any] = []

    async def run() -> None:
        link.start(lambda _k, d: got.append(d), ended.append)
        for _ in range(200):
            if ended:
                return
            await asyncio.sleep(0.01)

    asyncio.run(run())
    assert b"".join(got) == b"hello world"
    assert link.offset == 100 + 11
    assert ended == [{"exit_code": 3}]


def test_an_oversized_frame_ends_the_link_without_reading_it():
    huge = b"O" + (agent_sessions.MAX_FRAME + 1).to_bytes(4, "big") + b"x" * 10
    _, link = _attached(huge)
    ended: list[Any] = []

    async def run() -> None:
        link.start(lambda _k, _d: pytest.fail("no output expected"), ended.append)
        for _ in range(200):
            if ended:
                return
            await asyncio.sleep(0.01)

    asyncio.run(run())
    assert ended == [None] and link.ended
