"""The embedded mode's Celery broker: kombu's filesystem transport, with messages that
appear whole.

kombu's transport creates a message's file under its final name, then writes it. A worker
polling the folder in between moves the file away and reads it empty or cut short; the
payload does not parse, and the worker stops with "Unrecoverable error: JSONDecodeError",
which stops `make run` with it. On a fast disk the window is microseconds; on a slow one it
is each write's wait (tests/operations/test_slow_disk.py met it).

Here a message is written under a name no reader picks up, synced, then renamed into the
queue (a rename within a folder is atomic), so a reader sees the whole message or nothing.
A message that still does not parse (a file torn by a crash under the old transport) is
logged and skipped rather than stopping the worker."""

from __future__ import annotations

import logging
import os
import time
import uuid
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.json import dumps

logger = logging.getLogger(__name__)

STAGING_PREFIX = "."
"""Staged messages start with a dot: the reader takes only names whose part after the first
dot is `<queue>.msg`, and these have none before it."""


def message_name(queue: str) -> str:
    """kombu's naming: the reader takes messages in the order of their names, so they start
    with the time in milliseconds."""
    return f"{round(time.monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"


def write_whole(folder: str, name: str, body: bytes) -> None:
    final = os.path.join(folder, name)
    staged = os.path.join(folder, f"{STAGING_PREFIX}{name}.part")
    descriptor = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "wb") as staged_file:
            staged_file.write(body)
            staged_file.flush()
            # Synced before it is visible: a crash cannot leave a complete-looking name
            # over an empty file.
            os.fsync(staged_file.fileno())
        os.rename(staged, final)
    except BaseException:
        if os.path.exists(staged):
            os.unlink(staged)
        raise


class Channel(filesystem.Channel):
    # kombu's filesystem channel names the argument apart from its base class's; this
    # keeps the filesystem channel's signature, which its own callers use.
    def _put(self, queue: str, payload: dict[str, Any], **kwargs: Any) -> None:  # type: ignore[override]
        try:
            write_whole(self.data_folder_out, message_name(queue), dumps(payload).encode())
        except OSError as exc:
            raise ChannelError(f"Cannot add a message to {self.data_folder_out!r}: {exc}") from exc

    def _get(self, queue: str, timeout: float | None = None) -> Any:
        while True:
            try:
                return super()._get(queue)
            except ValueError as exc:  # the payload did not parse
                logger.error("Skipped a broker message that does not parse: %s", exc)


class Transport(filesystem.Transport):
    Channel = Channel
