"""Activity time of a sandbox (the idle reaper reads it), shared by the services and the
terminal registry so neither has to import the other."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import DatabaseError, connection
from django.utils import timezone

from common.database_errors import database_unavailable

from .models import Sandbox

ACTIVITY_WRITE_INTERVAL_S = 5  # coalesce activity writes so busy sandboxes do not contend

logger = logging.getLogger(__name__)


def sandbox_touch(sandbox: Sandbox) -> None:
    """Record activity (for the idle reaper); at most one write per few seconds."""
    now = timezone.now()
    threshold = now - timedelta(seconds=ACTIVITY_WRITE_INTERVAL_S)
    if sandbox.last_activity_at >= threshold:
        return  # the row we just read is fresh enough: no write, no round trip
    if _touched(sandbox.pk, now):
        sandbox.last_activity_at = now


def sandbox_touch_id(sandbox_id: str) -> None:
    """sandbox_touch by id, for callers holding no row (terminals, streamed runs)."""
    _touched(sandbox_id, timezone.now())


def _touched(sandbox_id: str, now: datetime) -> bool:
    """The write, after the operation it records ran: a database that cannot take it now
    (a slow disk holding SQLite's lock) skips it rather than fail that operation; the next
    activity writes it, and the idle reaper's timeout is minutes."""
    try:
        Sandbox.objects.filter(
            last_activity_at__lt=now - timedelta(seconds=ACTIVITY_WRITE_INTERVAL_S)
        ).update_row(sandbox_id, last_activity_at=now)
    except DatabaseError as exc:
        if connection.in_atomic_block or not database_unavailable(exc):
            raise
        logger.warning("activity of %s not recorded, the database could not take it", sandbox_id)
        return False
    return True
