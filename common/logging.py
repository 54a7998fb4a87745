"""Structured logs: JSON lines in production, with request and sandbox ids."""

from __future__ import annotations

import contextvars
import json
import logging
import time

request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
sandbox_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("sandbox_id", default="-")


class RequestContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get()
        if not hasattr(record, "sandbox_id"):
            record.sandbox_id = sandbox_id_var.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", "-"),
            "sandbox_id": getattr(record, "sandbox_id", "-"),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


# Tasks beat runs every few seconds whose runs are noise unless they changed something: their
# "sending due", "received" and "succeeded: 0" lines go to DEBUG; a run that returned a
# non-zero count (rows moved, invoices issued) stays at INFO.
ROUTINE_TASKS = frozenset({"billing.tasks.flush_usage"})
# Celery's loggers that announce each run of a task.
CELERY_TASK_LOGGERS = ("celery.beat", "celery.worker.strategy", "celery.app.trace")


class RoutineTaskFilter(logging.Filter):
    """Demote Celery's per-run lines about routine tasks to DEBUG unless the run did work.

    Attached to Celery's loggers (not handlers), so a demoted record is dropped here when its
    logger would not show DEBUG, and shown as DEBUG when it would.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        task, result = _celery_task_of(record)
        if task not in ROUTINE_TASKS or result not in (None, "0", "None"):
            return True
        record.levelno = logging.DEBUG
        record.levelname = logging.getLevelName(logging.DEBUG)
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def _celery_task_of(record: logging.LogRecord) -> tuple[str | None, str | None]:
    """(task name, its return value's repr or None) for a Celery per-run record."""
    args = record.args
    if isinstance(args, dict):  # worker: "Task %(name)s[%(id)s] received/succeeded ..."
        value = args.get("return_value")
        return args.get("name"), None if value is None else str(value)
    if isinstance(args, tuple) and len(args) == 2:  # beat: "Sending due task %s (%s)"
        return str(args[1]), None
    return None, None


def install_routine_task_filter() -> None:
    """Attach RoutineTaskFilter to Celery's per-run loggers (idempotent)."""
    for name in CELERY_TASK_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RoutineTaskFilter) for f in logger.filters):
            logger.addFilter(RoutineTaskFilter())
