"""Terminal output leaves from the reader's callback when the socket's queue is idle.

TerminalConsumer.terminal_output runs the server's send right there, one step, instead of
waking the outbound pump (a turn of the loop per chunk, measured in bench/bench_terminal.py).
That relies on daphne's send, under Channels' session middleware, writing the frame without
waiting for anything; the first tests fail if an upgrade changes that (the consumer would
still be right, through its fallback, only slower). The others drive the fallback with a
send that does wait: frames and control messages keep their order.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from channels.sessions import InstanceSessionWrapper
from daphne.server import Server

from sandboxes.realtime.terminal import TerminalConsumer


class _Protocol:
    def __init__(self) -> None:
        self.replies: list[dict[str, Any]] = []

    def handle_reply(self, message: dict[str, Any]) -> None:
        self.replies.append(message)


def _finishes_in_one_step(coro: Any) -> bool:
    try:
        coro.send(None)
    except StopIteration:
        return True
    coro.close()
    return False


def test_daphne_sends_a_websocket_frame_without_waiting():
    server = Server(application=None, endpoints=["tcp:port=0:interface=127.0.0.1"])
    protocol = _Protocol()
    server.connections = {protocol: {}}
    message = {"type": "websocket.send", "bytes": b"x"}
    assert _finishes_in_one_step(server.handle_reply(protocol, message))
    assert protocol.replies == [message]


@pytest.mark.django_db
def test_the_session_middleware_passes_a_frame_on_without_waiting():
    sent: list[dict[str, Any]] = []

    async def one_step_send(message: dict[str, Any]) -> None:
        sent.append(message)

    wrapper = InstanceSessionWrapper({"type": "websocket", "cookies": {}}, one_step_send)
    asyncio.run(wrapper.resolve_session())
    message = {"type": "websocket.send", "bytes": b"x"}
    assert _finishes_in_one_step(wrapper.send(message))
    assert sent == [message]


def test_the_web_server_runs_daphne_on_uvloop(server):  # type: ignore[no-untyped-def]
    # playground.webserver picks the loop before daphne builds it (a daphne that built it
    # elsewhere, or earlier, would leave the stock loop: slower, still correct).
    assert "uvloop" in Path(f"/proc/{server.pid}/maps").read_text()


def _consumer(send: Any) -> TerminalConsumer:
    consumer = TerminalConsumer()
    consumer.base_send = send
    consumer.init_outbound()
    return consumer


def test_output_leaves_at_once_when_nothing_is_queued():
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def drive() -> None:
        consumer = _consumer(send)
        await asyncio.sleep(0)  # the pump waits for work
        consumer.terminal_output(b"a")
        assert sent == [{"type": "websocket.send", "bytes": b"a"}]  # before any await
        consumer.enqueue({"type": "pong"})
        consumer.terminal_output(b"b")  # behind the queued pong
        await asyncio.sleep(0.01)
        consumer.stop_outbound()

    asyncio.run(drive())
    assert [m.get("bytes") or m.get("text") for m in sent] == [b"a", '{"type": "pong"}', b"b"]


def test_a_send_that_waits_holds_what_follows_in_order():
    sent: list[Any] = []
    gate: asyncio.Future[None] | None = None

    async def slow_send(message: dict[str, Any]) -> None:
        if message.get("bytes") == b"first":
            assert gate is not None
            await gate
            await asyncio.sleep(0)
        sent.append(message.get("bytes") or message.get("text") or message["type"])

    async def drive() -> None:
        nonlocal gate
        gate = asyncio.get_running_loop().create_future()
        consumer = _consumer(slow_send)
        consumer.close = _close_recorder(sent)  # type: ignore[method-assign]
        await asyncio.sleep(0)
        consumer.terminal_output(b"first")
        consumer.terminal_output(b"second")
        consumer.terminal_exited(0)
        await asyncio.sleep(0.01)
        assert sent == []  # all of it waits for the first frame
        gate.set_result(None)
        await asyncio.sleep(0.01)
        consumer.stop_outbound()

    asyncio.run(drive())
    assert sent == [b"first", b"second", '{"type": "exit", "code": 0}', ("close", 1000)]


def _close_recorder(sent: list[Any]) -> Any:
    async def close(code: int | None = None, reason: str | None = None) -> None:
        sent.append(("close", code))

    return close
