"""Writes to the usage ledger and its daily rollup, shared by every metering backend.

Both statements are single multi-row upserts that run the same on PostgreSQL and
SQLite (≥ 3.35 for RETURNING): the ledger insert skips event ids it already holds and
reports which rows it added, so the rollup is incremented for exactly those.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date, datetime

from django.db import connection
from django.db.models import Sum

from . import pricing
from .models import PlanChange, UsageDaily, UsageEvent

_CHUNK = 1000


@dataclass(frozen=True)
class MeteredEvent:
    """One execution on its way into the ledger."""

    event_id: str
    organization_id: int
    api_key_id: int | None
    operation: str
    occurred_at: datetime
    """Aware UTC datetime: fixes the day and the billing period the execution counts in."""


def _chunks(items: Sequence[MeteredEvent], size: int) -> Iterable[Sequence[MeteredEvent]]:
    for index in range(0, len(items), size):
        yield items[index : index + size]


def ledger_insert(
    events: Sequence[MeteredEvent], *, aggregated_at: datetime | None
) -> list[MeteredEvent]:
    """Append `events` to UsageEvent, skipping event ids already stored; return those added.

    Call inside the transaction that also updates the rollup. `aggregated_at` is stamped on
    the new rows when the caller rolls them up in the same transaction, else left empty.
    """
    unique: dict[str, MeteredEvent] = {}
    for event in events:
        unique.setdefault(event.event_id, event)
    if not unique:
        return []
    ops = connection.ops
    qn = ops.quote_name
    stamp = ops.adapt_datetimefield_value(aggregated_at) if aggregated_at else None
    added: set[str] = set()
    batch = list(unique.values())
    with connection.cursor() as cursor:
        for chunk in _chunks(batch, _CHUNK):
            params: list[str | int | None] = []
            for event in chunk:
                params += [
                    event.event_id,
                    event.organization_id,
                    event.api_key_id,
                    event.operation[:64],
                    ops.adapt_datetimefield_value(event.occurred_at),
                    stamp,
                ]
            values = ",".join(["(%s, %s, %s, %s, %s, %s)"] * len(chunk))
            cursor.execute(
                f"INSERT INTO {qn(UsageEvent._meta.db_table)} "  # noqa: S608 - identifiers are ours
                "(event_id, organization_id, api_key_id, operation, occurred_at, aggregated_at) "
                f"VALUES {values} ON CONFLICT (event_id) DO NOTHING RETURNING event_id",
                params,
            )
            added.update(row[0] for row in cursor.fetchall())
    return [event for event in batch if event.event_id in added]


def daily_counts(events: Iterable[MeteredEvent]) -> Counter[tuple[int, date, int]]:
    """(organization id, UTC day, api key id or 0) → executions."""
    return Counter((e.organization_id, e.occurred_at.date(), e.api_key_id or 0) for e in events)


def daily_add(counts: Counter[tuple[int, date, int]]) -> None:
    """Add `counts` to UsageDaily (upsert). Rows are touched in a fixed order so two
    concurrent flushes cannot deadlock each other."""
    if not counts:
        return
    ops = connection.ops
    table = ops.quote_name(UsageDaily._meta.db_table)
    rows = sorted(counts.items())
    with connection.cursor() as cursor:
        for index in range(0, len(rows), _CHUNK):
            chunk = rows[index : index + _CHUNK]
            params: list[str | int | None] = []
            for (org_id, day, key_ref), count in chunk:
                params += [org_id, ops.adapt_datefield_value(day), key_ref, count]
            values = ",".join(["(%s, %s, %s, %s)"] * len(chunk))
            cursor.execute(
                f"INSERT INTO {table} (organization_id, day, api_key_ref, count) "  # noqa: S608
                f"VALUES {values} ON CONFLICT (organization_id, day, api_key_ref) "
                f"DO UPDATE SET count = {table}.count + EXCLUDED.count",
                params,
            )


# --- reads the meter needs (selectors re-use them) -----------------------------------------


def usage_count_in_ledger(*, organization_id: int, start: date) -> int:
    """Executions of the period already in the database: the rollup plus ledger rows not
    yet folded into it (embedded mode). Excludes events still in Redis."""
    begin, end = pricing.period_bounds(start)
    rolled = UsageDaily.objects.filter(
        organization_id=organization_id, day__gte=begin.date(), day__lt=end.date()
    ).aggregate(total=Sum("count"))["total"]
    loose = UsageEvent.objects.filter(
        aggregated_at__isnull=True,
        organization_id=organization_id,
        occurred_at__gte=begin,
        occurred_at__lt=end,
    ).count()
    return int(rolled or 0) + loose


def usage_count_between(*, organization_id: int, begin: datetime, end: datetime) -> int:
    """Ledger rows of the organization with begin <= occurred_at < end (an index range count)."""
    return UsageEvent.objects.filter(
        organization_id=organization_id, occurred_at__gte=begin, occurred_at__lt=end
    ).count()


def plan_change_due(*, organization_id: int, now: datetime) -> bool:
    """A scheduled plan change has reached its effective time but is not applied yet."""
    return PlanChange.objects.filter(
        organization_id=organization_id,
        applied_at__isnull=True,
        canceled_at__isnull=True,
        effective_at__lte=now,
    ).exists()
