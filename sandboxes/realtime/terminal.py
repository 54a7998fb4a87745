"""/ws/sandboxes/<id>/terminals/<tid>: raw bytes both ways, JSON for control.

The keystroke path: the socket's bytes go to TerminalSession.write (a frame to the agent
that holds the PTY, on a non-blocking socket, and the count of what is due; no database, no
thread), the shell's output comes back from the agent's socket (loop.add_reader) as
`terminal_output` and leaves through the outbound queue. Due executions are recorded by a
flush about once a second, in a thread. Any web process can attach: the terminal lives in
the sandbox (sandboxes/terminals.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

from asgiref.typing import WebSocketReceiveEvent
from channels.db import database_sync_to_async
from channels.exceptions import StopConsumer

from common.errors import PaymentRequired
from sandboxes.services import ProviderError
from sandboxes.terminals import TerminalSession, clamp_size, terminal_attach

from .auth import WS_PAYMENT_REQUIRED, WS_UNAVAILABLE, RealtimeDenied, realtime_authorize
from .outbound import CLOSE, NO_CHANNEL_LAYER, OutboundConsumer

logger = logging.getLogger(__name__)

METER_FLUSH_S = 1.0
"""How often typed executions are recorded (and the next ones re-authorized)."""


class TerminalConsumer(OutboundConsumer):
    """One socket attached to one terminal (a TerminalClient of the registry)."""

    channel_layer_alias = NO_CHANNEL_LAYER

    async def connect(self) -> None:
        kwargs = self.scope["url_route"]["kwargs"]
        sandbox_id, terminal_id = kwargs["sandbox_id"], kwargs["terminal_id"]
        try:
            caller, sandbox = await database_sync_to_async(realtime_authorize)(
                self.scope, sandbox_id=sandbox_id, required_scope="terminal", feature="terminal"
            )
        except RealtimeDenied as denied:
            await self.refuse(denied)
            return
        session = await database_sync_to_async(terminal_attach)(
            caller=caller, sandbox=sandbox, terminal_id=terminal_id
        )
        if session is None:
            await self.refuse(
                RealtimeDenied(4404, 404, "terminal_not_found", "No such terminal in this sandbox.")
            )
            return
        self.session: TerminalSession | None = session
        await self.accept()
        self.init_outbound()
        terminal = session.terminal
        replay = terminal.attach(self)
        if replay:
            self.enqueue(replay)
        if terminal.ended:
            self.terminal_exited(terminal.exit_code)
            return
        self.spawn(self._flush_loop())

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Channels' AsyncConsumer.__call__ without its multiplexing: this socket has no
        channel layer, so there is one source of messages, and Channels' await_many_dispatch
        would still make a task and run an asyncio.wait for every keystroke. Messages are
        handled one after another, in order, as there. tests/realtime/test_keystroke_dispatch.py
        fails if a Channels upgrade changes what this replaces."""
        self.scope = scope
        self.channel_layer = None  # type: ignore[assignment]  # Channels' value with no layer
        self.base_send = send
        try:
            while True:
                await self.dispatch(await receive())
        except StopConsumer:
            pass

    # TerminalClient ---------------------------------------------------------------------------

    def terminal_output(self, data: bytes) -> None:
        self.enqueue(data)

    def terminal_exited(self, code: int | None) -> None:
        self.enqueue({"type": "exit", "code": code})
        self.enqueue((CLOSE, 1000))

    # input --------------------------------------------------------------------------------------

    async def dispatch(self, message: dict[str, Any]) -> None:
        """Keystrokes skip Channels' per-message closing of stale database connections (a
        round trip through the thread pool, measured at ~0.1-0.3 ms per keystroke in
        bench/bench_terminal.py): `receive` never touches the database, and the metering
        flush goes through database_sync_to_async, which does that check itself. Every other
        message takes Channels' own path. tests/realtime/test_keystroke_dispatch.py fails if
        a Channels upgrade changes what this relies on."""
        if message["type"] == "websocket.receive":
            data = message.get("bytes")
            session = getattr(self, "session", None)
            if data is not None and session is not None:
                session.write(data)  # a keystroke: what receive() would do, two calls sooner
                return
            await self.websocket_receive(cast(WebSocketReceiveEvent, message))
            return
        await super().dispatch(message)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        session = getattr(self, "session", None)
        if session is None:
            return
        if bytes_data is not None:
            session.write(bytes_data)
            return
        message = self.parse_json(text_data or "")
        if message is None:
            return
        kind = message["type"]
        if kind == "input" and isinstance(message.get("data"), str):
            session.write(message["data"].encode("utf-8", "surrogatepass"))
        elif kind == "resize":
            try:
                cols, rows = clamp_size(int(message["cols"]), int(message["rows"]))
            except (KeyError, TypeError, ValueError):
                self.error("invalid_message", "resize needs integer 'cols' and 'rows'.")
                return
            try:
                await session.terminal.resize(cols, rows)
            except ProviderError as exc:
                self.error(exc.code, exc.message)
        elif kind == "ping":
            self.enqueue({"type": "pong"})
        else:
            self.error("invalid_message", f"Unknown message type '{kind}'.")

    # metering -----------------------------------------------------------------------------------

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(METER_FLUSH_S)
            if self.session is not None and self.session.pending:
                try:
                    await self._flush()
                except PaymentRequired as exc:
                    self.error(exc.code, exc.message)
                    self.enqueue((CLOSE, WS_PAYMENT_REQUIRED))
                    return
                except Exception as exc:
                    # Typing goes on only while it can be counted (a disk too full for the
                    # records, a database that cannot serve): say so and close.
                    self.refuse_if_database_unavailable(exc)
                    self.enqueue((CLOSE, WS_UNAVAILABLE))
                    return

    async def _flush(self, authorize: bool = True) -> None:
        assert self.session is not None
        first, count = self.session.take()
        await database_sync_to_async(self.session.flush)(first, count, authorize=authorize)

    async def disconnect(self, code: int) -> None:
        session = getattr(self, "session", None)
        if session is not None:
            session.terminal.detach(self)
        self.stop_outbound()
        if session is not None and session.pending:
            try:
                await self._flush(authorize=False)
            except Exception:  # noqa: BLE001 - never lose the disconnect over billing
                logger.warning("could not record terminal lines", exc_info=True)
