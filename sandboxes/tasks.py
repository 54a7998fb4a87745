"""Celery tasks for the sandbox fleet: thin wrappers around sandboxes.operations.

Beat (playground/celery.py) runs reap_sandboxes every minute and reconcile_sandboxes every
five. Both are idempotent and safe to overlap, so a late or duplicated beat tick, a retry
after a worker was killed (acks_late + reject_on_worker_lost) or two beats by mistake do
no harm.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task

from . import operations


@shared_task(name="sandboxes.tasks.reap_sandboxes", ignore_result=True)
def reap_sandboxes() -> dict[str, Any]:
    """Destroy idle and expired sandboxes; finish destroys a killed run left behind."""
    return operations.report_summary(operations.reap_sandboxes())


@shared_task(name="sandboxes.tasks.reconcile_sandboxes", ignore_result=True)
def reconcile_sandboxes() -> dict[str, Any]:
    """Destroy orphan provider resources; error-then-destroy rows whose resource vanished."""
    return operations.report_summary(operations.reconcile_sandboxes())
