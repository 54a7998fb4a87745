"""Reads for the staff dashboard: fleet-wide views that no single app owns."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count
from django.db.models.functions import TruncHour
from django.utils import timezone

from accounts.models import Organization
from billing import pricing
from billing.metering import get_meter
from billing.models import UsageEvent
from billing.selectors import usage_summary
from sandboxes.models import LIVE_STATES, Sandbox, SandboxState
from sandboxes.providers import configured_provider_names, get_provider
from sandboxes.providers.base import ProviderError

MAX_ORGANIZATIONS_LISTED = 200

ACTIVE_STATES = (*LIVE_STATES, SandboxState.PAUSED)
"""What staff see as active: sandboxes holding a provider resource (a paused one keeps its
memory; an archived one only a snapshot)."""


@dataclass(frozen=True)
class ProviderStatus:
    name: str
    ok: bool
    detail: str
    latency_ms: float | None
    """Round trip of the provider's health probe; None when it could not be built."""
    live_sandboxes: int


@dataclass(frozen=True)
class OrganizationUsage:
    organization: Organization
    plan: str
    executions: int
    """Executions in the current billing period, including ones not flushed yet."""
    included_executions: int
    amount_so_far_cents: int
    live_sandboxes: int


@dataclass(frozen=True)
class HourBucket:
    hour: datetime
    """Start of the UTC hour."""
    executions: int


def staff_live_sandboxes() -> list[Sandbox]:
    """Every creating, running or paused sandbox of every organization, oldest first."""
    return list(
        Sandbox.objects.filter(state__in=ACTIVE_STATES)
        .select_related("organization", "created_by")
        .order_by("created_at")
    )


def staff_provider_statuses() -> list[ProviderStatus]:
    """Health of each configured provider (one probe each) and its live sandbox count."""
    live = dict(
        Sandbox.objects.filter(state__in=ACTIVE_STATES)
        .values_list("provider")
        .annotate(n=Count("id"))
        .values_list("provider", "n")
    )
    statuses = []
    for name in configured_provider_names():
        try:
            health = get_provider(name).health()
            statuses.append(
                ProviderStatus(
                    name, health.ok, health.detail, round(health.latency_ms, 1), live.get(name, 0)
                )
            )
        except ProviderError as exc:
            statuses.append(ProviderStatus(name, False, exc.message, None, live.get(name, 0)))
    return statuses


def staff_usage_by_organization() -> list[OrganizationUsage]:
    """This period's usage of every organization (busiest first), capped for page size."""
    live = dict(
        Sandbox.objects.filter(state__in=ACTIVE_STATES)
        .values_list("organization_id")
        .annotate(n=Count("id"))
        .values_list("organization_id", "n")
    )
    rows = []
    for org in Organization.objects.order_by("name")[:MAX_ORGANIZATIONS_LISTED]:
        summary = usage_summary(organization=org)
        rows.append(
            OrganizationUsage(
                organization=org,
                plan=summary.plan,
                executions=summary.executions,
                included_executions=summary.included_executions,
                amount_so_far_cents=summary.amount_so_far_cents,
                live_sandboxes=live.get(org.pk, 0),
            )
        )
    rows.sort(key=lambda r: (-r.executions, r.organization.name))
    return rows


def staff_executions_per_hour(*, hours: int = 24, now: datetime | None = None) -> list[HourBucket]:
    """Executions per UTC hour over the last `hours`, zeros included: the ledger plus events
    still buffered in the meter (Redis) that no flush has written yet, each counted once."""
    now = now or timezone.now()
    end = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    start = end - timedelta(hours=hours)
    counts: Counter[datetime] = Counter(
        dict(
            UsageEvent.objects.filter(occurred_at__gte=start, occurred_at__lt=end)
            .annotate(hour=TruncHour("occurred_at"))
            .values_list("hour")
            .annotate(n=Count("id"))
            .values_list("hour", "n")
        )
    )
    meter = get_meter()
    periods = {pricing.period_start(start), pricing.period_start(now)}
    pending = [
        event
        for org_id in Organization.objects.values_list("pk", flat=True)[:MAX_ORGANIZATIONS_LISTED]
        for period in periods
        for event in meter.pending(org_id, period)
        if start <= event.occurred_at < end
    ]
    if pending:
        flushed = set(
            UsageEvent.objects.filter(event_id__in=[e.event_id for e in pending]).values_list(
                "event_id", flat=True
            )
        )
        seen: set[str] = set()
        for event in pending:
            if event.event_id in flushed or event.event_id in seen:
                continue
            seen.add(event.event_id)
            counts[event.occurred_at.replace(minute=0, second=0, microsecond=0)] += 1
    return [
        HourBucket(hour=hour, executions=counts.get(hour, 0))
        for hour in (start + timedelta(hours=i) for i in range(hours))
    ]


def staff_sandbox_get(*, sandbox_id: str) -> Sandbox | None:
    """Any organization's sandbox by id (staff only; callers check is_staff)."""
    return Sandbox.objects.filter(pk=sandbox_id).select_related("organization").first()
