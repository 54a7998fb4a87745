"""The base of the sandbox consumers: one ordered outbound queue, errors and refusals."""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Coroutine
from typing import Any

from channels.generic.websocket import AsyncWebsocketConsumer

from common import database_errors
from common.parsers import client_json

from .auth import RealtimeDenied

logger = logging.getLogger(__name__)

NO_CHANNEL_LAYER = "__sandpit_none__"
"""Alias of no configured layer: terminal and exec sockets need no layer channel (and no
Redis connection each)."""
MAX_SLOW_CLIENT_BYTES = 8 * 1024 * 1024
"""A socket that falls this far behind the terminal is closed (1013) rather than buffered."""
CLOSE = object()
"""Queue marker: enqueue((CLOSE, code)) closes the socket after what is queued before it."""


class OutboundConsumer(AsyncWebsocketConsumer):
    """Sends go through a deque drained by one task: callbacks on the loop (PTY readers,
    watchers) enqueue without awaiting, and frames keep their order."""

    def init_outbound(self) -> None:
        self._out: deque[Any] = deque()
        self._out_bytes = 0
        self._out_wakeup: asyncio.Future[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._pump_task: asyncio.Task[None] | None = asyncio.ensure_future(self._pump())

    def enqueue(self, item: Any) -> None:
        """bytes → binary frame, dict → JSON text frame, (CLOSE, code) → close after the rest."""
        if not hasattr(self, "_out"):
            return
        if isinstance(item, bytes):
            # Output that arrives while a send is under way joins one frame; a bytearray
            # grows in place (bytes += would copy everything queued on every append).
            last = self._out[-1] if self._out else None
            if isinstance(last, bytearray):
                last += item
            else:
                self._out.append(bytearray(item))
            self._out_bytes += len(item)
            if self._out_bytes > MAX_SLOW_CLIENT_BYTES:
                self._out.clear()
                self._out.append({"type": "error", "code": "slow_client", "message": "Too slow."})
                self._out.append((CLOSE, 1013))
        else:
            self._out.append(item)
        waiter = self._out_wakeup
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _pump(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._out:
                self._out_wakeup = loop.create_future()
                await self._out_wakeup
                self._out_wakeup = None
                continue
            item = self._out.popleft()
            if isinstance(item, bytearray):
                self._out_bytes -= len(item)
                await self.send(bytes_data=bytes(item))
            elif isinstance(item, tuple) and item and item[0] is CLOSE:
                await self.close(code=item[1])
                return
            else:
                await self.send(text_data=json.dumps(item))

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run `coro` as a task of this socket (cancelled when it closes)."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def stop_outbound(self) -> None:
        for task in [getattr(self, "_pump_task", None), *getattr(self, "_tasks", ())]:
            if task is not None:
                task.cancel()

    async def refuse(self, denied: RealtimeDenied) -> None:
        await self.accept()
        await self.send(
            text_data=json.dumps({"type": "error", "code": denied.code, "message": denied.message})
        )
        await self.close(code=denied.close_code)

    def error(self, code: str, message: str, **extra: Any) -> None:
        self.enqueue({"type": "error", "code": code, "message": message, **extra})

    def refuse_if_database_unavailable(self, exc: Exception, **extra: Any) -> None:
        """An operation the database could not serve (or whose usage could not be recorded):
        its error frame, as REST's 503; any other exception is raised again, a bug."""
        if not database_errors.database_unavailable(exc):
            raise exc
        logger.warning("%s refused, the database cannot serve: %s", type(self).__name__, exc)
        self.error(database_errors.CODE, database_errors.MESSAGE, status=503, **extra)

    def parse_json(self, text: str) -> dict[str, Any] | None:
        try:
            message = client_json(text)
        except ValueError as exc:
            self.error("invalid_message", f"Send a JSON object with a 'type' ({exc}).")
            return None
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            self.error("invalid_message", "Send a JSON object with a 'type'.")
            return None
        return message
