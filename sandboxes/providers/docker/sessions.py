"""Live sessions of the Docker provider that are its own: file watches.

Terminals, port streams and streamed commands are the agent's sessions
(sandboxes/providers/agent_client.py), the same as the local provider's.
"""

from __future__ import annotations

import select
import socket
import time

from sandboxes.providers.base import FileEvent
from sandboxes.providers.watch_records import file_events

WATCH_BATCH_S = 0.05
CLOSE_WAIT_S = 2.0
"""How long close() waits for the agent to confirm the watcher is gone."""


class DockerWatch:
    """Iterator of FileEvent batches from the agent's ``watch`` (``inotifywait -m``
    records); `close()` hangs up, which makes the agent kill the watcher.

    Events closer than `WATCH_BATCH_S` to the first one of a batch are delivered
    together. A class rather than a generator so that `close()` stops the watcher even
    when nobody ever iterated.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._pending = b""
        self._closed = False

    def __iter__(self) -> DockerWatch:
        return self

    def __next__(self) -> list[FileEvent]:
        while not self._closed:
            events = file_events(self._next_records())
            if events:
                return events
        raise StopIteration

    def _next_records(self) -> list[tuple[str, str]]:
        batch: list[tuple[str, str]] = []
        batch_deadline: float | None = None
        while True:
            *records, self._pending = self._pending.split(b"\x00")
            for record in records:
                kinds, _, full = record.decode("utf-8", "surrogateescape").partition(" ")
                batch.append((kinds, full))
            if batch and batch_deadline is None:
                batch_deadline = time.monotonic() + WATCH_BATCH_S
            timeout = None if batch_deadline is None else batch_deadline - time.monotonic()
            if timeout is not None and timeout <= 0:
                return batch
            try:
                ready, _, _ = select.select([self._sock], [], [], timeout)
                chunk = self._sock.recv(65536) if ready else None
            except (OSError, ValueError):
                chunk = b""
            if chunk is None:
                return batch
            if not chunk:
                self.close()
                return batch
            self._pending += chunk

    def close(self) -> None:
        """Stop the watcher inside the sandbox; idempotent. Our end of the connection
        ends first, and the agent hangs up once it has killed and reaped inotifywait:
        waiting for that (bounded) means no watcher is left when this returns."""
        if self._closed:
            return
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + CLOSE_WAIT_S
            while (left := deadline - time.monotonic()) > 0:
                ready, _, _ = select.select([self._sock], [], [], left)
                if ready and not self._sock.recv(65536):
                    break
        except (OSError, ValueError):
            pass
        self._sock.close()
