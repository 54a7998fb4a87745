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
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from django.conf import settings

from .ledger import MeteredEvent

logger = logging.getLogger(__name__)

SUFFIX = ".json"


def spool_dir() -> Path:
    return Path(settings.VAR_DIR) / "usage-spool"


def spool_write(event: MeteredEvent) -> None:
    """Keep `event` on disk, durably, before the caller is answered."""
    directory = spool_dir()
    directory.mkdir(parents=True, exist_ok=True)
    name = hashlib.sha256(event.event_id.encode()).hexdigest() + SUFFIX
    temporary = directory / f".{uuid.uuid4().hex}.tmp"
    record = {
        "event_id": event.event_id,
        "organization_id": event.organization_id,
        "api_key_id": event.api_key_id,
        "operation": event.operation,
        "occurred_at": event.occurred_at.isoformat(),
    }
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, json.dumps(record).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, directory / name)
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
    return [event for _, event in spooled() if event.organization_id == organization_id]
