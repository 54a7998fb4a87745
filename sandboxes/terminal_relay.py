"""A terminal that lives in the sandbox's agent, seen from one web process.

The agent owns the PTY, the shell and the scrollback (sandboxes/agent/sessions.py); this
side is a relay for one socket: a SessionLink to the agent read with ``loop.add_reader``
and written with non-blocking sends, so a keystroke goes WebSocket -> agent socket -> PTY
with no thread and no channel layer in between. It has the surface of the registry's
Terminal that TerminalSession and the terminal socket use (attach, detach, write, resize,
ended, exit_code), so both kinds of terminal go through the same services.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from channels.db import database_sync_to_async

from .activity import sandbox_touch_id
from .agent_sessions import SessionLink
from .terminal_registry import TOUCH_INTERVAL_S, TerminalClient, clamp_size

logger = logging.getLogger(__name__)


class AgentTerminal:
    """One socket's link to an agent-held terminal. Used on the event loop only."""

    def __init__(self, sandbox_id: str, link: SessionLink) -> None:
        self.id = link.info.id
        self.sandbox_id = str(sandbox_id)
        self.link = link
        self.cols, self.rows = link.info.cols, link.info.rows
        self.ended = False
        self.exit_code: int | None = None
        self._client: TerminalClient | None = None
        self._last_touch = 0.0
        self._tasks: set[asyncio.Task[Any]] = set()

    def attach(self, client: TerminalClient) -> bytes:
        """Start relaying: the agent replays the scrollback, then live output follows (all
        of it through client.terminal_output). Returns b"": nothing to replay here."""
        self._client = client
        self.link.start(self._on_output, self._on_exit)
        return b""

    def _on_output(self, _kind: bytes, data: bytes) -> None:
        if self._client is not None:
            self._client.terminal_output(data)
        self.note_activity()

    def _on_exit(self, result: dict[str, Any] | None) -> None:
        self.ended = True
        code = (result or {}).get("exit_code")
        self.exit_code = code if isinstance(code, int) and not isinstance(code, bool) else -9
        client, self._client = self._client, None
        if client is not None:
            client.terminal_exited(self.exit_code)

    def detach(self, client: TerminalClient) -> None:
        """The socket is gone: drop the link (the shell goes on in the sandbox)."""
        if self._client is client:
            self._client = None
        self.link.close()

    def write(self, data: bytes) -> None:
        if self.ended or not data:
            return
        self.link.write(data)
        self.note_activity()

    async def resize(self, cols: int, rows: int) -> None:
        cols, rows = clamp_size(cols, rows)
        self.link.resize(cols, rows)
        self.cols, self.rows = cols, rows

    def note_activity(self) -> None:
        now = time.monotonic()
        if now - self._last_touch < TOUCH_INTERVAL_S:
            return
        self._last_touch = now
        # One touch per sandbox and interval in this process, however many of its terminals
        # are busy: each is a database write in a thread, and 50 streaming terminals each
        # touching their own would take the loop's GIL as often.
        if now - _sandbox_touched.get(self.sandbox_id, -TOUCH_INTERVAL_S) < TOUCH_INTERVAL_S:
            return
        if len(_sandbox_touched) > 4096:
            for sandbox_id, at in list(_sandbox_touched.items()):
                if now - at >= TOUCH_INTERVAL_S:
                    del _sandbox_touched[sandbox_id]
        _sandbox_touched[self.sandbox_id] = now
        task = asyncio.ensure_future(_touch(self.sandbox_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


_sandbox_touched: dict[str, float] = {}
"""When this process last marked each sandbox active for its terminals (monotonic s)."""


async def _touch(sandbox_id: str) -> None:
    try:
        await database_sync_to_async(sandbox_touch_id)(sandbox_id)
    except Exception:  # noqa: BLE001 - activity bookkeeping must never break a terminal
        logger.warning("could not record terminal activity", exc_info=True)
