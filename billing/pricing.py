"""Prices and the arithmetic of an invoice: pure functions, integer cents and Decimal.

Prices are constants in code (with tests), never environment variables: a price is a
promise to customers and changes through a release, not a deploy flag. The one
configurable number is the free allowance (SANDPIT_FREE_MONTHLY_EXECUTIONS), which
costs nothing.

Rounding rule: line amounts are computed exactly in Decimal cents; the overage line is
rounded half-up to the cent once, and the base fee is already whole cents, so the invoice
total (base + rounded overage) is the exact total rounded half-up to the cent.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

FREE = "free"
PREMIUM = "premium"
PLANS = (FREE, PREMIUM)

PREMIUM_BASE_CENTS = 9_700
"""Premium monthly fee: $97.00."""
PREMIUM_INCLUDED_EXECUTIONS = 100_000
"""Executions included in the premium fee each period."""
OVERAGE_CENTS_PER_EXECUTION = Decimal("0.097")
"""$0.00097 per execution beyond the included ones ($97 per 100,000)."""
CURRENCY = "usd"

FREE_FEATURES = frozenset({"sandbox", "exec", "files", "processes"})
PREMIUM_FEATURES = frozenset({"terminal", "watch", "ports", "tokens"})


def round_half_up_cents(amount_cents: Decimal) -> int:
    """Decimal cents → whole cents, halves away from zero (amounts here are never negative)."""
    return int(amount_cents.quantize(Decimal(1), rounding=ROUND_HALF_UP))


def included_executions(plan: str, *, free_allowance: int) -> int:
    """Executions a period includes at no extra charge: the free allowance or premium's 100,000."""
    if plan == PREMIUM:
        return PREMIUM_INCLUDED_EXECUTIONS
    if plan == FREE:
        return free_allowance
    raise ValueError(f"unknown plan {plan!r}")


@dataclass(frozen=True)
class LineItem:
    """One line of an invoice."""

    kind: str
    """"base" or "overage"."""
    description: str
    quantity: int
    """Periods for the base fee, executions for overage."""
    unit_price_cents: Decimal
    """Exact price of one unit, in cents (0.097 for an overage execution)."""
    amount_cents: int
    """quantity × unit price, rounded half-up to the cent."""


@dataclass(frozen=True)
class Quote:
    """The priced form of a period: what an invoice for `executions` on `plan` says."""

    plan: str
    executions: int
    included: int
    overage_executions: int
    lines: tuple[LineItem, ...]
    total_cents: int


def quote(plan: str, executions: int, *, free_allowance: int) -> Quote:
    """Price `executions` (≥ 0) in one period on `plan`.

    Free: always $0 (executions beyond the allowance are refused, not billed).
    Premium: $97.00 + $0.00097 × max(0, executions − 100,000), total rounded half-up.
    """
    if executions < 0:
        raise ValueError("executions must be >= 0")
    included = included_executions(plan, free_allowance=free_allowance)
    if plan == FREE:
        return Quote(plan, executions, included, 0, (), 0)
    overage = max(0, executions - included)
    lines = [
        LineItem(
            kind="base",
            description=f"Premium plan, includes {included:,} executions",
            quantity=1,
            unit_price_cents=Decimal(PREMIUM_BASE_CENTS),
            amount_cents=PREMIUM_BASE_CENTS,
        )
    ]
    if overage:
        lines.append(
            LineItem(
                kind="overage",
                description=f"{overage:,} executions beyond {included:,} at $0.00097",
                quantity=overage,
                unit_price_cents=OVERAGE_CENTS_PER_EXECUTION,
                amount_cents=round_half_up_cents(overage * OVERAGE_CENTS_PER_EXECUTION),
            )
        )
    return Quote(
        plan, executions, included, overage, tuple(lines), sum(x.amount_cents for x in lines)
    )


def total_cents(plan: str, executions: int, *, free_allowance: int) -> int:
    """The invoice total for `executions` on `plan`, in cents."""
    return quote(plan, executions, free_allowance=free_allowance).total_cents


def cap_allows(
    plan: str, executions_so_far: int, cap_cents: int | None, *, free_allowance: int
) -> bool:
    """Whether one more execution keeps the period's total within the spending cap.

    The cap bounds the invoice total: an execution is refused when counting it would make
    the total exceed `cap_cents`. A premium cap below the $97 base fee refuses everything.
    """
    if cap_cents is None:
        return True
    return total_cents(plan, executions_so_far + 1, free_allowance=free_allowance) <= cap_cents


def format_cents(cents: int) -> str:
    """12345 → "$123.45"."""
    return f"${cents // 100:,}.{cents % 100:02d}"


# --- Billing periods: calendar months in UTC ---------------------------------------------


def period_start(moment: datetime) -> date:
    """The first day of the UTC calendar month containing `moment` (an aware datetime)."""
    if moment.tzinfo is None:
        raise ValueError("moment must be timezone-aware")
    utc = moment.astimezone(UTC)
    return date(utc.year, utc.month, 1)


def next_period_start(start: date) -> date:
    """The first day of the month after `start`'s month."""
    return date(start.year + 1, 1, 1) if start.month == 12 else date(start.year, start.month + 1, 1)


def previous_period_start(start: date) -> date:
    return date(start.year - 1, 12, 1) if start.month == 1 else date(start.year, start.month - 1, 1)


def period_bounds(start: date) -> tuple[datetime, datetime]:
    """[start, end) of the period beginning on `start`, as aware UTC datetimes."""
    end = next_period_start(start)
    return (
        datetime(start.year, start.month, 1, tzinfo=UTC),
        datetime(end.year, end.month, 1, tzinfo=UTC),
    )


def period_key(start: date) -> str:
    """ "202501" for January 2025: used in cache keys."""
    return f"{start.year:04d}{start.month:02d}"


def projected_executions(executions_so_far: int, *, start: date, now: datetime) -> int:
    """Linear projection of the period's executions from the share of it elapsed at `now`."""
    begin, end = period_bounds(start)
    elapsed = (min(max(now, begin), end) - begin) / timedelta(seconds=1)
    length = (end - begin) / timedelta(seconds=1)
    if elapsed < 3600:  # less than an hour in: too little to extrapolate from
        return executions_so_far
    return int(Decimal(executions_so_far) * Decimal(length) / Decimal(elapsed))


# A projection needs this much history: a few hours of a first session, scaled to a month,
# says nothing (6 executions in the first hours "projected" 785).
PROJECTION_MIN_DAYS = 3


def projection_from_use(
    executions_so_far: int, *, start: date, now: datetime, first_use: datetime | None
) -> int | None:
    """The period's executions projected from the rate since use began, or None when fewer than
    PROJECTION_MIN_DAYS days of use lie behind `now` (nothing to extrapolate from yet).

    Use begins at the later of the period's start and `first_use` (the first execution of the
    period), so an organization that starts mid-month is not scaled by days it did not exist.
    """
    begin, end = period_bounds(start)
    now = min(max(now, begin), end)
    since = max(begin, first_use) if first_use else now
    observed = now - since
    if observed < timedelta(days=PROJECTION_MIN_DAYS):
        return None
    remaining_s = Decimal((end - now) / timedelta(seconds=1))
    observed_s = Decimal(observed / timedelta(seconds=1))
    return executions_so_far + int(Decimal(executions_so_far) * remaining_s / observed_s)
