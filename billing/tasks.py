"""Celery tasks: thin wrappers; each is idempotent and safe to run twice at once."""

from __future__ import annotations

from celery import shared_task

from common.periodic import SkippedWhileDatabaseUnavailable

from . import services


@shared_task(
    name="billing.tasks.flush_usage", ignore_result=True, base=SkippedWhileDatabaseUnavailable
)
def flush_usage() -> int:
    """Move recorded executions into the ledger (every 10 s from beat). Returns rows added."""
    return services.usage_flush().added


@shared_task(
    name="billing.tasks.close_billing_periods",
    ignore_result=True,
    base=SkippedWhileDatabaseUnavailable,
)
def close_billing_periods() -> int:
    """Issue the previous period's invoices (hourly from beat). Returns invoices seen."""
    return len(services.billing_periods_close())
