"""Prices: $97/month with 100,000 executions, $0.00097 each beyond, rounded half-up once."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

import pytest

from billing import pricing


def premium(executions: int) -> pricing.Quote:
    return pricing.quote("premium", executions, free_allowance=1000)


@pytest.mark.parametrize(
    ("executions", "total_cents"),
    [
        (0, 9_700),
        (100_000, 9_700),
        (100_001, 9_700),  # $97.00097 → $97.00
        (100_005, 9_700),  # 0.485¢ → 0¢
        (100_006, 9_701),  # 0.582¢ → 1¢
        (100_500, 9_749),  # 48.5¢ exactly: half-up → 49¢
        (200_000, 19_400),  # $97 per extra 100,000
        (250_000, 24_250),
    ],
)
def test_premium_total(executions: int, total_cents: int) -> None:
    assert premium(executions).total_cents == total_cents


def test_premium_lines_at_250000() -> None:
    quote = premium(250_000)
    assert [(line.kind, line.quantity, line.amount_cents) for line in quote.lines] == [
        ("base", 1, 9_700),
        ("overage", 150_000, 14_550),
    ]
    assert quote.lines[1].unit_price_cents == Decimal("0.097")
    assert quote.overage_executions == 150_000
    assert quote.included == 100_000


def test_premium_at_100000_has_no_overage_line() -> None:
    assert [line.kind for line in premium(100_000).lines] == ["base"]


def test_premium_at_100001_has_one_overage_execution() -> None:
    quote = premium(100_001)
    assert quote.overage_executions == 1
    assert quote.lines[1].amount_cents == 0


def test_free_is_always_zero() -> None:
    for executions in (0, 1000, 5000):
        quote = pricing.quote("free", executions, free_allowance=1000)
        assert quote.total_cents == 0 and quote.lines == ()
    assert pricing.included_executions("free", free_allowance=1000) == 1000


def test_unknown_plan_and_negative_executions_raise() -> None:
    with pytest.raises(ValueError):
        pricing.quote("gold", 1, free_allowance=1000)
    with pytest.raises(ValueError):
        premium(-1)


def test_cap_allows_refuses_the_execution_that_would_exceed_the_cap() -> None:
    # 100,010 executions cost 9701¢ (0.97¢ overage); 100,015 → 1.455¢ → 9701¢; 100,016 → 9702¢
    assert pricing.cap_allows("premium", 100_014, 9_701, free_allowance=1000)
    assert not pricing.cap_allows("premium", 100_015, 9_701, free_allowance=1000)
    assert not pricing.cap_allows("premium", 0, 9_699, free_allowance=1000)  # below the base fee
    assert pricing.cap_allows("premium", 10**9, None, free_allowance=1000)
    assert pricing.cap_allows("free", 10**6, 0, free_allowance=1000)


def test_periods_are_utc_calendar_months() -> None:
    assert pricing.period_start(datetime(2025, 1, 31, 23, 59, 59, 999000, tzinfo=UTC)) == date(
        2025, 1, 1
    )
    assert pricing.period_start(datetime(2025, 2, 1, tzinfo=UTC)) == date(2025, 2, 1)
    assert pricing.next_period_start(date(2025, 12, 1)) == date(2026, 1, 1)
    assert pricing.previous_period_start(date(2025, 1, 1)) == date(2024, 12, 1)
    assert pricing.period_bounds(date(2024, 2, 1)) == (
        datetime(2024, 2, 1, tzinfo=UTC),
        datetime(2024, 3, 1, tzinfo=UTC),
    )
    with pytest.raises(ValueError):
        pricing.period_start(datetime(2025, 1, 1))  # noqa: DTZ001 - naive on purpose


def test_projection_is_linear_in_elapsed_time() -> None:
    start = date(2025, 4, 1)  # 30 days
    assert (
        pricing.projected_executions(1000, start=start, now=datetime(2025, 4, 16, tzinfo=UTC))
        == 2000
    )
    assert (
        pricing.projected_executions(7, start=start, now=datetime(2025, 4, 1, 0, 30, tzinfo=UTC))
        == 7
    )


def test_format_cents() -> None:
    assert pricing.format_cents(24_250) == "$242.50"
    assert pricing.format_cents(5) == "$0.05"
