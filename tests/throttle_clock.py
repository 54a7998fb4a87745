"""A rate limit's clock held still, for tests that count requests against a per-minute limit.

The Redis limit (accounts/throttling.py) weighs the previous minute's count by how much of
it the sliding window still overlaps: a test whose requests straddle a minute's end sees
its earlier requests fade, and the request it expects refused (the 4th of 3 a minute) may
pass. Held in the middle of a minute, every request of the test falls in one window.
"""

from __future__ import annotations

import math
import time
import types

import pytest

from accounts import throttling
from accounts.throttling import PerKeyRateThrottle


def hold_mid_minute(monkeypatch: pytest.MonkeyPatch) -> float:
    """The rate limit's clock stopped halfway through the current minute; that instant."""
    now = (math.floor(time.time() / 60) + 0.5) * 60
    monkeypatch.setattr(throttling, "time", types.SimpleNamespace(time=lambda: now))
    return now


def limit_per_minute(monkeypatch: pytest.MonkeyPatch, requests: int) -> None:
    """Every caller's rate limit `requests` a minute, its clock held mid-minute."""
    monkeypatch.setattr(PerKeyRateThrottle, "THROTTLE_RATES", {"per_key": f"{requests}/min"})
    hold_mid_minute(monkeypatch)
