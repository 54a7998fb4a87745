"""Interactive terminals: the per-process registry of live PTYs (services: sandboxes/terminals.py).

A Terminal owns one provider PtySession, a bounded scrollback ring and the set of sockets
attached to it. Output is read on the event loop with `loop.add_reader` on the PTY's file
descriptor (no thread per read, no channel layer on the keystroke path) and written to every
attached socket as raw bytes; input from any socket goes straight to the PTY.

Only providers without the in-sandbox agent (the cloud ones) use this registry: their
terminals are pinned to the web process that created them (the PTY's descriptor lives
there; a socket that reaches another process gets close code 4404). Local and docker
terminals live in the sandbox's agent instead (sandboxes/terminals.py). A terminal outlives
its sockets (closing the browser does not kill the shell) and ends on DELETE, when its shell
exits, or when the sandbox is destroyed or reaped (the PTY stream then ends).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async

from .activity import sandbox_touch_id
from .providers.base import ProviderError, PtySession

logger = logging.getLogger(__name__)

SCROLLBACK_BYTES = 64 * 1024
"""Recent output replayed to a socket that (re)attaches."""
READ_CHUNK_BYTES = 65536
MAX_READS_PER_WAKEUP = 4
"""Coalesce up to 4 × 64 KB per readable event into one frame (throughput), one read when
that is all there is (latency)."""
TOUCH_INTERVAL_S = 5.0
"""Terminal I/O marks the sandbox active at most this often (the reaper reads it)."""
EXITED_TTL_S = 300.0
"""An ended terminal stays listed (with its exit code and scrollback) this long."""
MAX_WRITE_ON_LOOP_BYTES = 4096
"""Input up to this size is written on the loop (never blocks in practice); more in a thread."""


class TerminalClient(Protocol):
    """A socket attached to a terminal. Both methods are called on the event loop and must
    not block."""

    def terminal_output(self, data: bytes) -> None: ...

    def terminal_exited(self, code: int | None) -> None: ...


class Scrollback:
    """A ring of the most recent `limit` bytes of output."""

    def __init__(self, limit: int = SCROLLBACK_BYTES) -> None:
        self.limit = limit
        self._chunks: deque[bytes] = deque()
        self._size = 0

    def append(self, data: bytes) -> None:
        self._chunks.append(data)
        self._size += len(data)
        while self._size > self.limit:
            extra = self._size - self.limit
            first = self._chunks[0]
            if len(first) <= extra:
                self._chunks.popleft()
                self._size -= len(first)
            else:
                self._chunks[0] = first[extra:]
                self._size -= extra

    def snapshot(self) -> bytes:
        data = b"".join(self._chunks)
        if self._size >= self.limit:
            # The ring was cut mid-stream: do not start inside a UTF-8 sequence.
            skip = 0
            while skip < min(4, len(data)) and 0x80 <= data[skip] <= 0xBF:
                skip += 1
            data = data[skip:]
        return data

    def __len__(self) -> int:
        return self._size


@dataclass(frozen=True)
class TerminalInfo:
    """What the REST API shows about a terminal."""

    id: str
    sandbox_id: str
    cols: int
    rows: int
    shell: str | None
    created_at: float
    """Seconds since the epoch."""
    clients: int
    """Sockets attached right now."""
    running: bool
    exit_code: int | None


class Terminal:
    """One PTY in one sandbox. Mutated only on the event loop it is bound to."""

    def __init__(
        self,
        *,
        manager: TerminalManager,
        sandbox_id: str,
        organization_id: int,
        pty: PtySession,
        cols: int,
        rows: int,
        shell: str | None,
    ) -> None:
        self.id = "term_" + secrets.token_hex(8)
        self.manager = manager
        self.sandbox_id = sandbox_id
        self.organization_id = organization_id
        self.pty = pty
        self.cols, self.rows = cols, rows
        self.shell = shell
        self.created_at = time.time()
        self.scrollback = Scrollback()
        self.clients: set[TerminalClient] = set()
        self.ended = False
        self.exit_code: int | None = None
        self.ended_at: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fd: int | None = None
        self._pending_input: deque[bytes] = deque()
        self._writer: asyncio.Task[None] | None = None
        self._last_touch = 0.0
        self._tasks: set[asyncio.Task[Any]] = set()

    # --- lifecycle (on the loop) ---------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Begin reading output on `loop` (the running loop by default). Idempotent."""
        if self._loop is not None or self.ended:
            return
        self._loop = loop or asyncio.get_running_loop()
        self._fd = self.pty.fileno()
        self._loop.add_reader(self._fd, self._on_readable)

    def _stop_reading(self) -> None:
        if self._loop is not None and self._fd is not None:
            try:
                self._loop.remove_reader(self._fd)
            except (ValueError, OSError, RuntimeError):
                pass
            self._fd = None

    def _on_readable(self) -> None:
        chunks: list[bytes] = []
        ended = False
        for _ in range(MAX_READS_PER_WAKEUP):
            try:
                data = self.pty.read(READ_CHUNK_BYTES)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                ended = True
                break
            chunks.append(data)
            if len(data) < READ_CHUNK_BYTES:
                break
        if chunks:
            output = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            self.scrollback.append(output)
            for client in tuple(self.clients):
                client.terminal_output(output)
            self.note_activity()
        if ended:
            self._stop_reading()
            self._spawn(self._finish())

    async def _finish(self) -> None:
        """The PTY stream ended: learn the exit code, tell every socket, schedule removal."""
        code = await sync_to_async(_wait_exit_code, thread_sensitive=False)(self.pty)
        self._mark_ended(code)
        await sync_to_async(self.pty.close, thread_sensitive=False)()
        self.manager.forget_later(self, EXITED_TTL_S)

    def _mark_ended(self, code: int | None) -> None:
        if self.ended:
            return
        self.ended = True
        self.exit_code = code
        self.ended_at = time.time()
        self._stop_reading()
        for client in tuple(self.clients):
            client.terminal_exited(code)
        self.clients.clear()

    def kill_on_loop(self) -> None:
        """Stop reading and tell the sockets the terminal is gone (the PTY is closed by the
        caller, off the loop, since closing may block)."""
        self._mark_ended(self.exit_code if self.exit_code is not None else -9)
        for task in tuple(self._tasks):
            task.cancel()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- sockets -----------------------------------------------------------------------------

    def attach(self, client: TerminalClient) -> bytes:
        """Attach a socket; returns the scrollback to replay before live output."""
        self.start()
        snapshot = self.scrollback.snapshot()
        if not self.ended:
            self.clients.add(client)
        return snapshot

    def detach(self, client: TerminalClient) -> None:
        self.clients.discard(client)

    # --- input ---------------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        """Send input bytes to the shell, in order. Never blocks the loop: small writes go
        straight to the non-blocking descriptor, large or backed-up ones through a thread."""
        if self.ended or not data:
            return
        self.note_activity()
        if not self._pending_input and len(data) <= MAX_WRITE_ON_LOOP_BYTES:
            try:
                self.pty.write(data)
            except (OSError, ProviderError):
                logger.info("terminal write failed", extra={"terminal_id": self.id})
            return
        self._pending_input.append(data)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.ensure_future(self._drain_input())

    async def _drain_input(self) -> None:
        while self._pending_input and not self.ended:
            data = self._pending_input.popleft()
            try:
                await sync_to_async(self.pty.write, thread_sensitive=False)(data)
            except (OSError, ProviderError):
                logger.info("terminal write failed", extra={"terminal_id": self.id})
                self._pending_input.clear()

    async def resize(self, cols: int, rows: int) -> None:
        cols, rows = clamp_size(cols, rows)
        await sync_to_async(self.pty.resize, thread_sensitive=False)(cols, rows)
        self.cols, self.rows = cols, rows

    def note_activity(self) -> None:
        now = time.monotonic()
        if now - self._last_touch >= TOUCH_INTERVAL_S:
            self._last_touch = now
            self._spawn(_touch(self.sandbox_id))

    def info(self) -> TerminalInfo:
        return TerminalInfo(
            id=self.id,
            sandbox_id=self.sandbox_id,
            cols=self.cols,
            rows=self.rows,
            shell=self.shell,
            created_at=self.created_at,
            clients=len(self.clients),
            running=not self.ended,
            exit_code=self.exit_code,
        )


async def _touch(sandbox_id: str) -> None:
    try:
        await database_sync_to_async(sandbox_touch_id)(sandbox_id)
    except Exception:  # noqa: BLE001 - activity bookkeeping must never break a terminal
        logger.warning("could not record terminal activity", exc_info=True)


def _wait_exit_code(pty: PtySession) -> int | None:
    """The shell's exit status; the stream can end a moment before the process is reaped."""
    for _ in range(20):
        try:
            code = pty.exit_code()
        except ProviderError:
            return -9
        if code is not None:
            return code
        time.sleep(0.05)
    return None


def clamp_size(cols: int, rows: int) -> tuple[int, int]:
    return max(2, min(int(cols), 1000)), max(1, min(int(rows), 500))


class TerminalManager:
    """The terminals of this process, keyed by id.

    Safe to call from the request threads of sync views: work that must happen on the event
    loop is handed to it with call_soon_threadsafe / run_coroutine_threadsafe.
    """

    def __init__(self) -> None:
        self._terminals: dict[str, Terminal] = {}
        self._lock = threading.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Remember the server's event loop (called by the ASGI app on every request)."""
        self.loop = loop

    def _live_loop(self) -> asyncio.AbstractEventLoop | None:
        loop = self.loop
        if loop is None or loop.is_closed() or not loop.is_running():
            return None
        return loop

    def _on_loop(self, fn: Any, *args: Any) -> None:
        """Run fn(*args) on the bound loop and wait for it (or inline when there is none or
        we are on it)."""
        loop = self._live_loop()
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None or running is loop:
            fn(*args)
            return
        future: concurrent.futures.Future[None] = concurrent.futures.Future()

        def call() -> None:
            try:
                fn(*args)
                future.set_result(None)
            except BaseException as exc:  # noqa: BLE001 - handed back to the caller
                future.set_exception(exc)

        loop.call_soon_threadsafe(call)
        future.result(timeout=10)

    def add(self, terminal: Terminal) -> None:
        with self._lock:
            self._terminals[terminal.id] = terminal
        loop = self._live_loop()
        if loop is not None:
            loop.call_soon_threadsafe(terminal.start, loop)

    def get(self, sandbox_id: str, terminal_id: str) -> Terminal | None:
        terminal = self._terminals.get(terminal_id)
        if terminal is None or terminal.sandbox_id != str(sandbox_id):
            return None
        return terminal

    def for_sandbox(self, sandbox_id: str) -> list[Terminal]:
        with self._lock:
            found = [t for t in self._terminals.values() if t.sandbox_id == str(sandbox_id)]
        return sorted(found, key=lambda t: t.created_at)

    def all(self) -> list[Terminal]:
        with self._lock:
            return list(self._terminals.values())

    def remove(self, terminal: Terminal) -> None:
        """End a terminal: sockets get an exit message, the shell's process tree is killed.
        Blocking (closing may call the provider); call from a thread."""
        with self._lock:
            self._terminals.pop(terminal.id, None)
        self._on_loop(terminal.kill_on_loop)
        try:
            terminal.pty.close()
        except ProviderError:
            logger.warning("terminal close failed", exc_info=True)

    def forget_later(self, terminal: Terminal, delay_s: float) -> None:
        def forget() -> None:
            with self._lock:
                if self._terminals.get(terminal.id) is terminal:
                    del self._terminals[terminal.id]

        asyncio.get_running_loop().call_later(delay_s, forget)


terminal_manager = TerminalManager()
"""This process's terminals."""


def terminals_close_for_sandbox(sandbox_id: str) -> int:
    """Kill every terminal of a sandbox in this process (sandbox_destroy calls it, so the
    sockets get their exit message and the registry forgets them at once, whichever
    provider it is). Blocking; call from a thread. Returns how many."""
    terminals = terminal_manager.for_sandbox(sandbox_id)
    for terminal in terminals:
        terminal_manager.remove(terminal)
    return len(terminals)
