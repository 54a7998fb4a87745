"""Billing changes: flushing usage, plan changes, the spending cap, invoices and payments."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from accounts.models import Organization, User
from common.errors import ApplicationError, Conflict

from . import metering, pricing
from .ledger import usage_count_in_ledger
from .metering import plan_changes_apply_due
from .models import (
    IdempotencyRecord,
    Invoice,
    InvoiceLineItem,
    InvoiceStatus,
    Payment,
    PlanChange,
)
from .payments import get_payment_gateway
from .selectors import plan_for_period, plan_scheduled

logger = logging.getLogger(__name__)

CLOSE_GRACE = timedelta(minutes=5)
"""A period is closed this long after it ends, so the last executions have been flushed."""
IDEMPOTENCY_RETENTION = timedelta(hours=24)


# --- Usage -----------------------------------------------------------------------------------


def usage_flush(*, batch_size: int = 5000, max_batches: int = 200) -> metering.FlushResult:
    """Move recorded executions into the ledger and the daily rollup.

    Safe to run at any time, concurrently and after a crash at any point: a batch is
    written in one transaction with unique event ids and acknowledged only afterwards.
    """
    meter = metering.get_meter()
    if isinstance(meter, metering.RedisMeter):
        return metering.flush_redis(meter, batch_size=batch_size, max_batches=max_batches)
    return metering.flush_database(batch_size=batch_size, max_batches=max_batches)


# --- Plans and the spending cap --------------------------------------------------------------------


@dataclass(frozen=True)
class PlanState:
    """An organization's plan now and the change waiting to take effect, if any."""

    plan: str
    scheduled_plan: str | None
    scheduled_at: datetime | None


def plan_state(*, organization: Organization) -> PlanState:
    scheduled = plan_scheduled(organization=organization)
    return PlanState(
        plan=organization.plan,
        scheduled_plan=scheduled.plan if scheduled else None,
        scheduled_at=scheduled.effective_at if scheduled else None,
    )


def organization_plan_change(
    *, organization: Organization, plan: str, requested_by: User | None, now: datetime | None = None
) -> PlanState:
    """Change the plan. Upgrades take effect now and bill the current period as premium
    (no proration); downgrades take effect at the start of the next period. Asking for the
    plan already in effect cancels a scheduled change. Updates `organization` in place."""
    if plan not in pricing.PLANS:
        raise ApplicationError(f"Unknown plan {plan!r}.", code="validation_error")
    now = now or timezone.now()
    flag: datetime | None = None
    with transaction.atomic():
        org = Organization.objects.select_for_update().get(pk=organization.pk)
        pending = PlanChange.objects.filter(
            organization=org, applied_at__isnull=True, canceled_at__isnull=True
        )
        if plan == org.plan:
            pending.update(canceled_at=now)
        elif plan == pricing.PREMIUM:
            pending.update(canceled_at=now)
            PlanChange.objects.create(
                organization=org,
                previous_plan=org.plan,
                plan=plan,
                requested_by=requested_by,
                requested_at=now,
                effective_at=now,
                applied_at=now,
            )
            org.plan = plan
            org.save(update_fields=["plan"])
        elif not pending.filter(plan=plan).exists():
            pending.update(canceled_at=now)
            flag, _ = pricing.period_bounds(pricing.next_period_start(pricing.period_start(now)))
            PlanChange.objects.create(
                organization=org,
                previous_plan=org.plan,
                plan=plan,
                requested_by=requested_by,
                requested_at=now,
                effective_at=flag,
            )
        else:
            flag = pending.filter(plan=plan).values_list("effective_at", flat=True).first()
        transaction.on_commit(lambda: metering.get_meter().flag_plan_change(org.pk, flag))
    organization.plan = org.plan
    return plan_state(organization=organization)


def plan_changes_apply_all_due(*, now: datetime | None = None) -> int:
    """Apply every organization's due plan changes; returns how many organizations changed."""
    now = now or timezone.now()
    org_ids = set(
        PlanChange.objects.filter(
            applied_at__isnull=True, canceled_at__isnull=True, effective_at__lte=now
        ).values_list("organization_id", flat=True)
    )
    for org in Organization.objects.filter(pk__in=org_ids):
        plan_changes_apply_due(organization=org, now=now)
    return len(org_ids)


def organization_spending_cap_set(*, organization: Organization, cap_cents: int | None) -> None:
    """Set (or clear, with None) the hard cap on a period's invoice total, in cents.
    Takes effect on the next metered call."""
    if cap_cents is not None and cap_cents < 0:
        raise ApplicationError("cap_cents must be 0 or more.", code="validation_error")
    organization.spending_cap_cents = cap_cents
    organization.save(update_fields=["spending_cap_cents"])


# --- Invoices ----------------------------------------------------------------------------------------


def invoice_close_period(*, organization: Organization, start: date) -> Invoice | None:
    """Issue the invoice of a closed period (once): None when the period was on the free plan.

    Two workers closing the same period race on the unique (organization, period) constraint;
    the loser returns the winner's invoice.
    """
    existing = Invoice.objects.filter(organization=organization, period_start=start).first()
    if existing is not None:
        return existing
    plan = plan_for_period(organization=organization, start=start)
    if plan != pricing.PREMIUM:
        return None
    executions = usage_count_in_ledger(organization_id=organization.pk, start=start)
    quote = pricing.quote(plan, executions, free_allowance=settings.SANDPIT_FREE_MONTHLY_EXECUTIONS)
    try:
        with transaction.atomic():
            invoice = Invoice.objects.create(
                organization=organization,
                period_start=start,
                period_end=pricing.next_period_start(start),
                plan=plan,
                executions=executions,
                included_executions=quote.included,
                total_cents=quote.total_cents,
                currency=pricing.CURRENCY,
            )
            InvoiceLineItem.objects.bulk_create(
                InvoiceLineItem(
                    invoice=invoice,
                    kind=line.kind,
                    description=line.description,
                    quantity=line.quantity,
                    unit_price_cents=line.unit_price_cents,
                    amount_cents=line.amount_cents,
                )
                for line in quote.lines
            )
    except IntegrityError:
        return Invoice.objects.get(organization=organization, period_start=start)
    invoice_collect(invoice=invoice)
    return invoice


def invoice_collect(*, invoice: Invoice) -> None:
    """Ask the payment gateway to collect an open invoice; mark it paid if it says so."""
    if invoice.status != InvoiceStatus.OPEN or invoice.total_cents == 0:
        return
    result = get_payment_gateway().charge(invoice=invoice)
    if result.status == "succeeded":
        invoice_mark_paid(
            invoice=invoice, recorded_by=None, reference=result.reference, gateway=result.gateway
        )


def billing_periods_close(*, now: datetime | None = None) -> list[Invoice]:
    """Close the previous period: flush usage, issue its invoices, apply due plan changes.

    Idempotent and safe with two workers at once. An organization that fails is logged
    and skipped (the next hourly run retries it); the others still get their invoices.
    """
    now = now or timezone.now()
    usage_flush()
    current = pricing.period_start(now - CLOSE_GRACE)
    previous = pricing.previous_period_start(current)
    begin, end = pricing.period_bounds(previous)
    candidates = (
        Organization.objects.filter(created_at__lt=end)
        .filter(Q(plan=pricing.PREMIUM) | Q(plan_changes__effective_at__gte=begin))
        .exclude(invoices__period_start=previous)
        .distinct()
    )
    invoices = []
    for organization in candidates:
        try:
            invoice = invoice_close_period(organization=organization, start=previous)
        except Exception:
            logger.exception("closing %s for organization %s failed", previous, organization.pk)
            continue
        if invoice is not None:
            invoices.append(invoice)
    plan_changes_apply_all_due(now=now)
    idempotency_purge(before=now - IDEMPOTENCY_RETENTION)
    return invoices


def invoice_mark_paid(
    *, invoice: Invoice, recorded_by: User | None, reference: str = "", gateway: str = "manual"
) -> Invoice:
    """Record full payment of an open invoice. Paying a paid invoice changes nothing;
    a void invoice raises Conflict ('invoice_void')."""
    with transaction.atomic():
        locked = Invoice.objects.select_for_update().get(pk=invoice.pk)
        if locked.status == InvoiceStatus.VOID:
            raise Conflict("A void invoice cannot be paid.", code="invoice_void")
        if locked.status == InvoiceStatus.OPEN:
            Payment.objects.create(
                invoice=locked,
                amount_cents=locked.total_cents,
                gateway=gateway,
                reference=reference,
                recorded_by=recorded_by,
            )
            locked.status = InvoiceStatus.PAID
            locked.paid_at = timezone.now()
            locked.save(update_fields=["status", "paid_at"])
    invoice.status, invoice.paid_at = locked.status, locked.paid_at
    return invoice


def invoice_void(*, invoice: Invoice) -> Invoice:
    """Void an open invoice (nothing is owed). A paid invoice raises Conflict ('invoice_paid')."""
    with transaction.atomic():
        locked = Invoice.objects.select_for_update().get(pk=invoice.pk)
        if locked.status == InvoiceStatus.PAID:
            raise Conflict("A paid invoice cannot be voided.", code="invoice_paid")
        if locked.status == InvoiceStatus.OPEN:
            locked.status = InvoiceStatus.VOID
            locked.voided_at = timezone.now()
            locked.save(update_fields=["status", "voided_at"])
    invoice.status, invoice.voided_at = locked.status, locked.voided_at
    return invoice


def idempotency_purge(*, before: datetime) -> int:
    """Forget Idempotency-Keys first seen before `before`; returns how many."""
    deleted, _ = IdempotencyRecord.objects.filter(created_at__lt=before).delete()
    return deleted
