"""Billing reads: usage of a period, the plan in effect, invoices and the upcoming one."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import UTC, date, datetime, time

from django.conf import settings
from django.db.models import BigIntegerField, CharField, Count, QuerySet, Value
from django.db.models.functions import Coalesce, TruncDate
from django.utils import timezone

from accounts.models import ApiKey, Organization
from common.errors import NotFound

from . import pricing
from .ledger import usage_count_in_ledger
from .metering import get_meter
from .models import Invoice, PlanChange, UsageDaily, UsageEvent


def plan_scheduled(*, organization: Organization) -> PlanChange | None:
    """The plan change waiting for its effective time, if any."""
    return (
        PlanChange.objects.filter(
            organization=organization, applied_at__isnull=True, canceled_at__isnull=True
        )
        .order_by("-effective_at")
        .first()
    )


def plan_for_period(*, organization: Organization, start: date) -> str:
    """The plan a period is billed at: the plan in effect at the period's last instant.

    So an upgrade during a period bills that whole period as premium; a downgrade, which
    takes effect when the next period starts, leaves the current period premium.
    """
    _, end = pricing.period_bounds(start)
    changes = list(
        PlanChange.objects.filter(organization=organization, canceled_at__isnull=True).order_by(
            "effective_at", "id"
        )
    )
    in_effect = [change for change in changes if change.effective_at < end]
    if in_effect:
        return in_effect[-1].plan
    if changes:
        return changes[0].previous_plan
    return organization.plan


@dataclass(frozen=True)
class KeyUsage:
    api_key_id: int | None
    """None for calls without an API key (browser session, sandbox token)."""
    name: str
    executions: int


@dataclass(frozen=True)
class UsageSummary:
    """An organization's usage in one period, including executions not flushed yet."""

    period_start: date
    period_end: date
    """First day of the next period (exclusive)."""
    plan: str
    executions: int
    included_executions: int
    """The free allowance or premium's included executions."""
    by_day: list[tuple[date, int]]
    """Every day of the period up to today, in order, zeros included."""
    by_key: list[KeyUsage]
    amount_so_far_cents: int
    projected_executions: int
    """Projected to period end; equal to `executions` while `projection_available` is False."""
    projected_cents: int
    spending_cap_cents: int | None
    projection_available: bool = True
    """False until pricing.PROJECTION_MIN_DAYS days of use lie behind (see projection_note)."""
    projection_note: str = ""
    """Why there is no projection yet, for people; empty when there is one."""


def _usage_counts(organization: Organization, start: date) -> Counter[tuple[date, int]]:
    """(day, api key id or 0) → executions: rollup + loose ledger rows + unflushed events.

    The unflushed events are read first, then the database in one statement (one snapshot
    on PostgreSQL and SQLite alike): an event a flush moves meanwhile (into the ledger,
    then out of Redis or the spool; loose rows into the rollup) is counted in exactly one
    place, never in none."""
    begin, end = pricing.period_bounds(start)
    pending = {event.event_id: event for event in get_meter().pending(organization.pk, start)}
    day = TruncDate("occurred_at", tzinfo=UTC)
    key_ref = Coalesce("api_key_id", Value(0), output_field=BigIntegerField())
    one = Value(1, output_field=BigIntegerField())
    no_event = Value("", output_field=CharField())
    rolled = UsageDaily.objects.filter(
        organization=organization, day__gte=begin.date(), day__lt=end.date()
    ).values_list("day", "api_key_ref", "count", no_event)
    events = UsageEvent.objects.filter(organization=organization)
    loose = events.filter(
        aggregated_at__isnull=True, occurred_at__gte=begin, occurred_at__lt=end
    ).values_list(day, key_ref, one, no_event)
    # Pending events the ledger already holds (named by their id): counted there.
    in_ledger = events.filter(event_id__in=list(pending)).values_list(
        day, key_ref, Value(0, output_field=BigIntegerField()), "event_id"
    )
    counts: Counter[tuple[date, int]] = Counter()
    for row_day, row_key, count, event_id in rolled.union(loose, in_ledger, all=True):
        if event_id:
            pending.pop(event_id, None)
        else:
            counts[(row_day, row_key)] += count
    for event in pending.values():
        counts[(event.occurred_at.astimezone(UTC).date(), event.api_key_id or 0)] += 1
    return counts


def usage_summary(*, organization: Organization, now: datetime | None = None) -> UsageSummary:
    """Usage of the current period so far, its price so far and projected to period end."""
    now = now or timezone.now()
    start = pricing.period_start(now)
    end = pricing.next_period_start(start)
    counts = _usage_counts(organization, start)
    per_day: Counter[date] = Counter()
    per_key: Counter[int] = Counter()
    for (day, key_ref), count in counts.items():
        per_day[day] += count
        per_key[key_ref] += count
    today = now.date()
    days = [date(start.year, start.month, d) for d in range(1, (min(today, end) - start).days + 2)]
    days = [d for d in days if d < end]
    names = dict(ApiKey.objects.filter(pk__in=[k for k in per_key if k]).values_list("pk", "name"))
    by_key = sorted(
        (
            KeyUsage(
                api_key_id=key or None,
                name=names.get(key, "(deleted key)") if key else "(no API key)",
                executions=count,
            )
            for key, count in per_key.items()
        ),
        key=lambda usage: (-usage.executions, usage.name),
    )
    executions = sum(per_day.values())
    allowance = settings.SANDPIT_FREE_MONTHLY_EXECUTIONS
    plan = plan_for_period(organization=organization, start=start)
    used_days = [d for d, count in per_day.items() if count]
    first_use = datetime.combine(min(used_days), time.min, tzinfo=UTC) if used_days else None
    projection = pricing.projection_from_use(executions, start=start, now=now, first_use=first_use)
    projected = executions if projection is None else projection
    return UsageSummary(
        period_start=start,
        period_end=end,
        plan=plan,
        executions=executions,
        included_executions=pricing.included_executions(plan, free_allowance=allowance),
        by_day=[(d, per_day.get(d, 0)) for d in days],
        by_key=by_key,
        amount_so_far_cents=pricing.total_cents(plan, executions, free_allowance=allowance),
        projected_executions=projected,
        projected_cents=pricing.total_cents(plan, projected, free_allowance=allowance),
        spending_cap_cents=organization.spending_cap_cents,
        projection_available=projection is not None,
        projection_note=""
        if projection is not None
        else f"A projection needs {pricing.PROJECTION_MIN_DAYS} days of use this period.",
    )


def usage_rows(
    *, organization: Organization, start: date
) -> list[tuple[date, int | None, str, int]]:
    """(day, api key id, key name, executions) for the CSV export, by day then key."""
    counts = _usage_counts(organization, start)
    names = dict(
        ApiKey.objects.filter(pk__in=[k for _, k in counts if k]).values_list("pk", "name")
    )
    return [
        (day, key or None, names.get(key, "(deleted key)") if key else "(no API key)", count)
        for (day, key), count in sorted(counts.items())
    ]


@dataclass(frozen=True)
class UpcomingInvoice:
    """A preview of the current period's invoice: as it stands now and projected."""

    period_start: date
    period_end: date
    plan: str
    executions: int
    quote: pricing.Quote
    projected: pricing.Quote
    projection_available: bool = True
    projection_note: str = ""


def invoice_upcoming(*, organization: Organization, now: datetime | None = None) -> UpcomingInvoice:
    summary = usage_summary(organization=organization, now=now)
    allowance = settings.SANDPIT_FREE_MONTHLY_EXECUTIONS
    return UpcomingInvoice(
        period_start=summary.period_start,
        period_end=summary.period_end,
        plan=summary.plan,
        executions=summary.executions,
        quote=pricing.quote(summary.plan, summary.executions, free_allowance=allowance),
        projected=pricing.quote(
            summary.plan, summary.projected_executions, free_allowance=allowance
        ),
        projection_available=summary.projection_available,
        projection_note=summary.projection_note,
    )


def invoices_for_org(*, organization: Organization) -> QuerySet[Invoice]:
    return (
        Invoice.objects.filter(organization=organization)
        .prefetch_related("lines")
        .order_by("-period_start", "-id")
    )


def invoice_get_for_org(*, organization: Organization, invoice_id: int) -> Invoice:
    """The organization's invoice; NotFound (404) for a missing id or another organization's."""
    invoice = invoices_for_org(organization=organization).filter(pk=invoice_id).first()
    if invoice is None:
        raise NotFound("No such invoice.")
    return invoice


def invoice_get(*, invoice_id: int) -> Invoice:
    """Any organization's invoice (staff only); NotFound when missing."""
    invoice = Invoice.objects.filter(pk=invoice_id).prefetch_related("lines").first()
    if invoice is None:
        raise NotFound("No such invoice.")
    return invoice


def usage_ledger_totals(*, organization_id: int, start: date) -> tuple[int, int]:
    """(ledger rows, rollup total) for a period: equal when the rollup is sound."""
    begin, end = pricing.period_bounds(start)
    ledger = UsageEvent.objects.filter(
        organization_id=organization_id, occurred_at__gte=begin, occurred_at__lt=end
    ).aggregate(n=Count("id"))["n"]
    return int(ledger), usage_count_in_ledger(organization_id=organization_id, start=start)
