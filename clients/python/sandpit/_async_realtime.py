"""The WebSocket side of the async client: streamed commands, terminals and file watchers,
each a socket and a reader task (the sync client's are in _sync_realtime.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from . import _common as c
from ._http import AsyncHttpClient
from .errors import RequestTimeoutError, SandpitConnectionError, SandpitError, error_from
from .models import CommandResult, FileEvent


async def open_socket(http: AsyncHttpClient, path: str) -> ClientConnection:
    try:
        return await connect(
            http.ws_base + path,
            additional_headers={"Authorization": f"Bearer {http.config.api_key}"},
            open_timeout=30,
            max_size=None,
        )
    except (InvalidStatus, OSError, TimeoutError) as exc:
        raise c.ws_open_error(exc, path) from None


class AsyncCommandHandle:
    """Like `CommandHandle`: a command streaming over the exec socket, in a reader task."""

    def __init__(self, ws: ClientConnection, message: dict[str, Any], state: c.ExecState):
        self._ws = ws
        self.id: str = message["id"]
        self._state = state
        self._started = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        try:
            async for frame in self._ws:
                over = self._state.feed(frame)
                if self._state.pid is not None:
                    self._started.set()
                if over:
                    break
        except ConnectionClosed as exc:
            if self._state.result is None and self._state.error is None:
                self._state.error = c.ws_close_error(exc.rcvd.code if exc.rcvd else None, "")
        finally:
            self._started.set()
            await self._ws.close()

    async def pid(self) -> int | None:
        await asyncio.wait_for(self._started.wait(), 30)
        return self._state.pid

    async def _send(self, message: dict[str, Any]) -> None:
        try:
            await self._ws.send(json.dumps(message))
        except ConnectionClosed:
            pass

    async def send_stdin(self, data: str, *, eof: bool = False) -> None:
        await self._send({"type": "stdin", "id": self.id, "data": data, "eof": eof})

    async def close_stdin(self) -> None:
        await self._send({"type": "stdin_close", "id": self.id})

    async def signal(self, signal: str = "SIGINT") -> None:
        await self._send({"type": "signal", "id": self.id, "signal": signal})

    async def kill(self) -> bool:
        if self._task.done():
            return False
        await self._send({"type": "cancel", "id": self.id})
        return True

    async def wait(self, timeout_s: float | None = None) -> CommandResult:
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout_s)
        except TimeoutError:
            raise RequestTimeoutError("The command is still running.", code="timeout") from None
        if self._state.error is not None:
            raise self._state.error
        assert self._state.result is not None
        return self._state.result

    @property
    def finished(self) -> bool:
        return self._task.done()


class AsyncWatcher:
    def __init__(self, ws: ClientConnection, on_event: Callable[[FileEvent], Any]) -> None:
        self._ws = ws
        self.on_event = on_event
        self.id = "w1"
        self._task: asyncio.Task[None] | None = None

    async def _next(self, kind: str) -> dict[str, Any]:
        while True:
            try:
                frame = await asyncio.wait_for(self._ws.recv(), 30)
            except TimeoutError:
                await self._ws.close()
                raise RequestTimeoutError(
                    f"No '{kind}' from the events socket.", code="timeout"
                ) from None
            except ConnectionClosed as exc:
                raise c.ws_close_error(exc.rcvd.code if exc.rcvd else None, "") from None
            message = json.loads(frame)
            if message.get("type") == "error":
                await self._ws.close()
                raise c.ws_error(message)
            if message.get("type") == kind:
                return dict(message)

    async def _start(
        self, path: str, recursive: bool, ignore: list[str] | None, debounce_ms: int
    ) -> None:
        ready = await self._next("ready")
        if "files" not in (ready.get("signals") or []):
            await self._ws.close()
            raise error_from("scope_missing", "This credential cannot watch files.", 403)
        message: dict[str, Any] = {
            "type": "watch",
            "id": self.id,
            "path": path,
            "recursive": recursive,
            "debounce_ms": debounce_ms,
        }
        if ignore:
            message["ignore"] = list(ignore)
        await self._ws.send(json.dumps(message))
        await self._next("watching")
        self._task = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        try:
            async for frame in self._ws:
                message = json.loads(frame)
                if message.get("type") == "files" and message.get("watcher") == self.id:
                    for event in c.file_events(message):
                        self.on_event(event)
        except ConnectionClosed:
            pass

    async def stop(self) -> None:
        await self._ws.close()
        if self._task is not None:
            await asyncio.wait([self._task], timeout=5)


class AsyncTerminal:
    """Like `Terminal`, with a reader task."""

    def __init__(
        self,
        ws: ClientConnection,
        terminal_id: str,
        on_data: Callable[[bytes], Any] | None,
        on_kill: Callable[[], Awaitable[bool]],
    ) -> None:
        self.id = terminal_id
        self.on_data = on_data
        self._ws = ws
        self._on_kill = on_kill
        self._buffer = bytearray()
        self.exit_code: int | None = None
        self.error: SandpitError | None = None
        self._task = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        try:
            async for frame in self._ws:
                if isinstance(frame, bytes):
                    if self.on_data is None:
                        self._buffer += frame
                    else:
                        self.on_data(frame)
                    continue
                message = json.loads(frame)
                if message.get("type") == "exit":
                    self.exit_code = message.get("code")
                elif message.get("type") == "error":
                    self.error = c.ws_error(message)
        except ConnectionClosed:
            pass

    def output(self) -> bytes:
        data, self._buffer = bytes(self._buffer), bytearray()
        return data

    async def send(self, data: bytes | str) -> None:
        try:
            await self._ws.send(data.encode() if isinstance(data, str) else data)
        except ConnectionClosed as exc:
            raise SandpitConnectionError("The terminal socket is closed.", code="closed") from exc

    async def resize(self, cols: int, rows: int) -> None:
        try:
            await self._ws.send(json.dumps({"type": "resize", "cols": cols, "rows": rows}))
        except ConnectionClosed:
            pass

    async def wait(self, timeout_s: float | None = None) -> int | None:
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout_s)
        except TimeoutError:
            raise RequestTimeoutError("The terminal is still running.", code="timeout") from None
        if self.error is not None and self.exit_code is None:
            raise self.error
        return self.exit_code

    async def close(self, *, kill: bool = True) -> None:
        await self._ws.close()
        await asyncio.wait([self._task], timeout=5)
        if kill:
            await self._on_kill()
