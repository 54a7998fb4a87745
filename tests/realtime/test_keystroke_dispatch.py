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


def test_the_consumer_loop_replaces_only_the_multiplexing_of_a_layerless_socket():
    # TerminalConsumer.__call__ replaces AsyncConsumer.__call__ for a socket without a channel
    # layer: that one sets the scope and base_send and runs await_many_dispatch over the one
    # receive callable until StopConsumer. A Channels upgrade that does more there fails here.
    import channels.consumer

    source = inspect.getsource(AsyncConsumer.__call__)
    for needed in (
        "self.scope = scope",
        "self.base_send = send",
        "await_many_dispatch([receive], self.dispatch)",
        "except StopConsumer",
    ):
        assert needed in source, needed
    assert source.count("self.") == 16, "AsyncConsumer.__call__ changed"
    assert channels.consumer.get_channel_layer(TerminalConsumer.channel_layer_alias) is None

    async def drive() -> list[dict]:
        seen: list[dict] = []
        messages = [
            {"type": "websocket.receive", "bytes": b"a"},
            {"type": "websocket.receive", "bytes": b"b"},
        ]

        async def receive() -> dict:
            if not messages:
                raise channels.consumer.StopConsumer
            return messages.pop(0)

        consumer = TerminalConsumer()

        async def dispatch(message: dict) -> None:
            seen.append(message)

        consumer.dispatch = dispatch  # type: ignore[method-assign]
        await consumer({"type": "websocket"}, receive, None)
        return seen

    assert [m["bytes"] for m in asyncio.run(drive())] == [b"a", b"b"]
