"""A projection only once there is use to extrapolate from."""

from __future__ import annotations

from datetime import UTC, date, datetime

from billing import pricing

START = date(2025, 4, 1)  # 30 days


def test_no_projection_in_the_first_days_of_use() -> None:
    # 6 executions in the first hours "projected" 785 before.
    now = datetime(2025, 4, 1, 6, tzinfo=UTC)
    first_use = datetime(2025, 4, 1, tzinfo=UTC)
    assert pricing.projection_from_use(6, start=START, now=now, first_use=first_use) is None


def test_no_projection_without_any_use() -> None:
    now = datetime(2025, 4, 20, tzinfo=UTC)
    assert pricing.projection_from_use(0, start=START, now=now, first_use=None) is None


def test_projection_from_the_rate_since_first_use() -> None:
    # Started on the 11th; 500 in 5 days -> 100 a day; 15 days left -> 2,000 by the end.
    first_use = datetime(2025, 4, 11, tzinfo=UTC)
    now = datetime(2025, 4, 16, tzinfo=UTC)
    assert pricing.projection_from_use(500, start=START, now=now, first_use=first_use) == 2000


def test_projection_from_the_period_start_for_earlier_use() -> None:
    first_use = datetime(2025, 3, 20, tzinfo=UTC)  # before the period: counts from the 1st
    now = datetime(2025, 4, 16, tzinfo=UTC)
    assert pricing.projection_from_use(1000, start=START, now=now, first_use=first_use) == 2000
