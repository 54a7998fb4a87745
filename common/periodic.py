"""The base of beat's periodic tasks: a run that meets a database that cannot serve (a slow
disk holding SQLite's lock, PostgreSQL restarting) is skipped with one warning line instead
of failing with a traceback; beat sends the next run, and each task is idempotent."""

from __future__ import annotations

import logging
from typing import Any

from celery import Task
from django.db import DatabaseError

from .database_errors import database_unavailable

logger = logging.getLogger(__name__)


class SkippedWhileDatabaseUnavailable(Task):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except DatabaseError as exc:
            if not database_unavailable(exc):
                raise
            logger.warning(
                "%s skipped, the database could not serve (%s); beat sends the next run",
                self.name,
                exc,
            )
            return None
