"""The terminal consumer's one departure from Channels' dispatch, and what it relies on.

TerminalConsumer.dispatch sends websocket.receive straight to Channels' own
`websocket_receive` (which calls `receive`), skipping the closing of stale database
connections that AsyncConsumer.dispatch does before every message. These tests fail if a
Channels upgrade renames what that relies on or starts doing something else there.
"""

from __future__ import annotations

import asyncio
import inspect

from channels.consumer import AsyncConsumer
from channels.generic.websocket import AsyncWebsocketConsumer

from sandboxes.realtime.terminal import TerminalConsumer


class _Session:
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)


def test_channels_still_closes_old_connections_in_dispatch_and_routes_receive():
    # What the override replaces: Channels' dispatch closes old connections, then calls the
    # handler named after the message type; websocket.receive's handler calls receive().
    source = inspect.getsource(AsyncConsumer.dispatch)
    assert "aclose_old_connections" in source
    assert "get_handler_name" in source
    receive_source = inspect.getsource(AsyncWebsocketConsumer.websocket_receive)
    assert "self.receive(" in receive_source


def test_keystrokes_skip_the_connection_check_and_reach_the_terminal(monkeypatch):
    import channels.consumer

    checks: list[int] = []

    async def counting_close() -> None:
        checks.append(1)

    monkeypatch.setattr(channels.consumer, "aclose_old_connections", counting_close)
    consumer = TerminalConsumer()
    session = _Session()
    consumer.session = session  # type: ignore[assignment]

    async def drive() -> None:
        await consumer.dispatch({"type": "websocket.receive", "bytes": b"ls\r"})
        await consumer.dispatch(
            {"type": "websocket.receive", "text": '{"type": "input", "data": "x"}'}
        )
        assert checks == []
        # Anything else still goes through Channels' dispatch (and its check).
        handled: list[dict] = []

        async def websocket_disconnect(message: dict) -> None:
            handled.append(message)

        consumer.websocket_disconnect = websocket_disconnect  # type: ignore[method-assign]
        await consumer.dispatch({"type": "websocket.disconnect", "code": 1000})
        assert handled and checks == [1]

    asyncio.run(drive())
    assert session.written == [b"ls\r", b"x"]
