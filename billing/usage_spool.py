"""Embedded mode: usage records that met a database that could not take them.

Without Redis, `metering_record` writes the ledger row itself, after the operation ran. On a
slow disk SQLite's one write lock can stay taken past its busy timeout; failing the record
then would leave an operation that ran uncounted and answer its caller with an error. So the
record is kept here instead: one small file per event under SANDPIT_VAR_DIR/usage-spool,
written to a temporary name, synced, then renamed (a reader sees whole records or none;
the event id names the file, so a retry of one event is one file). The flush
(`flush_database`, every 10 s) moves them into the ledger, whose unique event id makes that
safe to repeat, and removes them; until then the usage reads count them as pending."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from django.conf import settings

from .ledger import MeteredEvent

logger = logging.getLogger(__name__)

SUFFIX = ".json"

HEADROOM_BYTES = 8 * 1024 * 1024
"""Free space the spool's disk must have for a metered operation to start: below it the
operation is refused (503) before it runs, since neither the database on that disk nor the
spool could keep its record. Thousands of records fit in it (a block each)."""


def spool_dir() -> Path:
    return Path(settings.VAR_DIR) / "usage-spool"


def record_json(event: MeteredEvent) -> str:
    return json.dumps(
        {
            "event_id": event.event_id,
            "organization_id": event.organization_id,
            "api_key_id": event.api_key_id,
            "operation": event.operation,
            "occurred_at": event.occurred_at.isoformat(),
        }
    )


def has_headroom() -> bool:
    """Whether the spool's disk has HEADROOM_BYTES free (for an unprivileged writer)."""
    directory = spool_dir()
    try:
        stats = os.statvfs(directory if directory.exists() else directory.parent)
    except OSError:
        return True  # cannot tell: the record's own errors will say
    return stats.f_bavail * stats.f_frsize >= HEADROOM_BYTES


def spool_write(event: MeteredEvent) -> None:
    """Keep `event` on disk, durably, before the caller is answered."""
    directory = spool_dir()
    directory.mkdir(parents=True, exist_ok=True)
    name = hashlib.sha256(event.event_id.encode()).hexdigest() + SUFFIX
    temporary = directory / f".{uuid.uuid4().hex}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        try:
            os.write(fd, record_json(event).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, directory / name)
    except OSError:
        temporary.unlink(missing_ok=True)  # no torn leftovers on a full disk
        raise
    directory_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory_fd)  # the rename itself survives a crash
    finally:
        os.close(directory_fd)


def spooled() -> Iterator[tuple[Path, MeteredEvent]]:
    """Each kept event and its file. A file that does not parse (written by hand, or a
    disk that lost it) is logged and left for an operator, never half-counted."""
    try:
        names = sorted(os.listdir(spool_dir()))
    except FileNotFoundError:
        return
    for name in names:
        if not name.endswith(SUFFIX):
            continue
        path = spool_dir() / name
        try:
            record = json.loads(path.read_bytes())
            event = MeteredEvent(
                event_id=str(record["event_id"]),
                organization_id=int(record["organization_id"]),
                api_key_id=None if record["api_key_id"] is None else int(record["api_key_id"]),
                operation=str(record["operation"]),
                occurred_at=datetime.fromisoformat(record["occurred_at"]),
            )
        except FileNotFoundError:
            continue  # another flush took it meanwhile
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.error("unreadable usage spool file %s left in place: %s", path, exc)
            continue
        yield path, event


def spooled_for(organization_id: int) -> list[MeteredEvent]:
    """The organization's kept events: on disk, and held in this process's memory."""
    with _held_lock:
        held = [event for event in _held.values() if event.organization_id == organization_id]
    events = {event.event_id: event for event in held}
    for _, event in spooled():
        if event.organization_id == organization_id:
            events[event.event_id] = event
    return list(events.values())


# --- Held in memory: a disk too full for the spool too ----------------------------------------

MAX_HELD = 100_000
_held: dict[str, MeteredEvent] = {}
_held_lock = threading.Lock()


def keep(event: MeteredEvent) -> bool:
    """Keep `event` on disk; when the disk cannot take it either (full), hold it in this
    process's memory until a later `keep` or `write_held` writes it, and return False. The
    operation it counts has run: better counted late than lost. What memory holds is lost
    only with the process, and each such record is logged whole for an operator."""
    write_held()
    try:
        spool_write(event)
        return True
    except OSError as exc:
        with _held_lock:
            held = len(_held) < MAX_HELD
            if held:
                _held[event.event_id] = event
        logger.error(
            "usage record %s, the disk could not take it (%s): %s",
            "held in memory until it can" if held else "lost",
            exc,
            record_json(event),
        )
        return False


def held_count() -> int:
    return len(_held)


def write_held() -> None:
    """Write the records held in memory to the spool, oldest first, while the disk takes them."""
    with _held_lock:
        events = list(_held.values())
    for event in events:
        try:
            spool_write(event)
        except OSError:
            return
        with _held_lock:
            _held.pop(event.event_id, None)
        logger.warning("usage record held in memory now kept on disk: %s", event.event_id)
