"""Celery tasks for the sandbox fleet: thin wrappers around sandboxes.operations.

Beat (playground/celery.py) runs reap_sandboxes every minute, reconcile_sandboxes every
five and check_docker_engines every half minute. All are idempotent and safe to overlap,
so a late or duplicated beat tick, a retry after a worker was killed (acks_late +
reject_on_worker_lost) or two beats by mistake do no harm.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task

from common.periodic import SkippedWhileDatabaseUnavailable

from . import engine_health, operations, templates


@shared_task(
    name="sandboxes.tasks.reap_sandboxes", ignore_result=True, base=SkippedWhileDatabaseUnavailable
)
def reap_sandboxes() -> dict[str, Any]:
    """Destroy idle and expired sandboxes; finish destroys a killed run left behind."""
    return operations.report_summary(operations.reap_sandboxes())


@shared_task(
    name="sandboxes.tasks.reconcile_sandboxes",
    ignore_result=True,
    base=SkippedWhileDatabaseUnavailable,
)
def reconcile_sandboxes() -> dict[str, Any]:
    """Destroy orphan provider resources; error-then-destroy rows whose resource vanished."""
    return operations.report_summary(operations.reconcile_sandboxes())


@shared_task(
    name="sandboxes.tasks.check_docker_engines",
    ignore_result=True,
    base=SkippedWhileDatabaseUnavailable,
)
def check_docker_engines() -> dict[str, Any]:
    """Probe every Docker engine; mark the sandboxes of one down too long lost."""
    return operations.report_summary(engine_health.engines_check())


@shared_task(name="sandboxes.tasks.build_template", ignore_result=True)
def build_template(template_id: str, network: bool = False) -> None:
    """Build a queued template (sandboxes/templates.py); a second delivery does nothing."""
    templates.template_build(template_id, network=network)
