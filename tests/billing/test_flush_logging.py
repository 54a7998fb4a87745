"""Routine flush_usage runs stay off an INFO console unless they moved something."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from celery.app.trace import LOG_RECEIVED, LOG_SUCCESS

import playground.celery  # noqa: F401  (installs the filter, as every worker and beat does)


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def collected() -> Iterator[_Collect]:
    handler = _Collect()
    loggers = [
        logging.getLogger(n) for n in ("celery.beat", "celery.worker.strategy", "celery.app.trace")
    ]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.INFO)
    yield handler
    for lg, level in zip(loggers, levels, strict=True):
        lg.removeHandler(handler)
        lg.setLevel(level)


def _run_lines(task: str, return_value: str) -> None:
    """The three lines Celery logs for one scheduled run, in Celery's own formats."""
    logging.getLogger("celery.beat").info("Scheduler: Sending due task %s (%s)", "entry", task)
    received = {"id": "x", "name": task, "args": "()", "kwargs": "{}", "eta": None}
    logging.getLogger("celery.worker.strategy").info(LOG_RECEIVED, received)
    success = {"id": "x", "name": task, "return_value": return_value, "runtime": 0.01}
    logging.getLogger("celery.app.trace").info(LOG_SUCCESS, success)


def test_idle_flush_logs_nothing_at_info(collected: _Collect) -> None:
    _run_lines("billing.tasks.flush_usage", "0")
    assert [r.getMessage() for r in collected.records] == []


def test_flush_that_moved_rows_is_logged_at_info(collected: _Collect) -> None:
    _run_lines("billing.tasks.flush_usage", "12")
    [line] = collected.records
    assert line.levelno == logging.INFO
    assert line.getMessage().endswith(": 12")


def test_other_tasks_keep_their_lines(collected: _Collect) -> None:
    _run_lines("sandboxes.tasks.reap_sandboxes", "0")
    assert [r.levelno for r in collected.records] == [logging.INFO] * 3


def test_idle_flush_lines_are_debug_when_debug_is_on(collected: _Collect) -> None:
    logging.getLogger("celery.app.trace").setLevel(logging.DEBUG)
    _run_lines("billing.tasks.flush_usage", "0")
    [line] = collected.records
    assert line.levelname == "DEBUG"
