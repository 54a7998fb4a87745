"""Terminal output goes through the socket's outbound queue, so frames and control messages
keep their order whatever the server's send waits for; the web server runs on uvloop."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from sandboxes.realtime.terminal import TerminalConsumer


class _Protocol:
    def __init__(self) -> None:
        self.replies: list[dict[str, Any]] = []

    def handle_reply(self, message: dict[str, Any]) -> None:
        self.replies.append(message)


def test_the_web_server_runs_daphne_on_uvloop(server):  # type: ignore[no-untyped-def]
    # playground.webserver picks the loop before daphne builds it (a daphne that built it
    # elsewhere, or earlier, would leave the stock loop: slower, still correct).
    assert "uvloop" in Path(f"/proc/{server.pid}/maps").read_text()


def _consumer(send: Any) -> TerminalConsumer:
    consumer = TerminalConsumer()
    consumer.base_send = send
    consumer.init_outbound()
    return consumer


def test_a_send_that_waits_holds_what_follows_in_order():
    sent: list[Any] = []
    gate: asyncio.Future[None] | None = None

    async def slow_send(message: dict[str, Any]) -> None:
        if (message.get("bytes") or b"").startswith(b"first"):
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
    # Output queued together leaves as one frame (the pump joins adjacent chunks).
    assert sent == [b"firstsecond", '{"type": "exit", "code": 0}', ("close", 1000)]


def _close_recorder(sent: list[Any]) -> Any:
    async def close(code: int | None = None, reason: str | None = None) -> None:
        sent.append(("close", code))

    return close
