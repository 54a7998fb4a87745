"""Per-key rate limiting: one bucket per API key, 429 in the error shape with Retry-After.

Runs on real Redis when REDIS_URL is set (the Lua sliding window) and on the embedded
local-memory cache (DRF's throttle) either way."""

from __future__ import annotations

import uuid

import pytest
from django.conf import settings

from accounts import throttling
from accounts.throttling import PerKeyRateThrottle, _seconds_until_admitted
from tests.throttle_clock import limit_per_minute

pytestmark = pytest.mark.django_db


@pytest.fixture(params=["redis", "local-memory"])
def five_a_minute(request, monkeypatch, settings):  # type: ignore[no-untyped-def]
    if request.param == "redis" and not settings.REDIS_URL:
        from tests.requirements import missing_part

        missing_part("REDIS_URL is not set")
    if request.param == "local-memory":
        settings.REDIS_URL = ""
    limit_per_minute(monkeypatch, 5)
    # Fresh buckets: key ids repeat across test databases, Redis outlives them.
    monkeypatch.setattr(
        PerKeyRateThrottle, "cache_format", f"throttle_{uuid.uuid4().hex}_%(scope)s_%(ident)s"
    )
    return request.param


def test_sixth_request_in_a_minute_is_429_and_other_keys_are_unaffected(
    five_a_minute, api_a, api_b
):  # type: ignore[no-untyped-def]
    for _ in range(5):
        assert api_a.get("/api/v1/sandboxes").status_code == 200
    refused = api_a.get("/api/v1/sandboxes")
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limited"
    assert 1 <= int(refused["Retry-After"]) <= 60
    assert api_b.get("/api/v1/sandboxes").status_code == 200


@pytest.mark.parametrize("five_a_minute", ["redis"], indirect=True)
def test_redis_buckets_are_shared_by_every_process(five_a_minute, api_a):  # type: ignore[no-untyped-def]
    for _ in range(5):
        assert api_a.get("/api/v1/sandboxes").status_code == 200
    # Another worker process has its own client; simulate it with a fresh one.
    throttling._clients.clear()
    assert api_a.get("/api/v1/sandboxes").status_code == 429
    assert settings.REDIS_URL in throttling._clients


def test_retry_after_estimates():  # type: ignore[no-untyped-def]
    # The current window alone is full at 30 s in: wait for the rest of it, then for
    # `current` to decay under the limit in the next.
    assert _seconds_until_admitted(10, 60, 0.5, 10, 0) == pytest.approx(30 + 60 * (1 - 10 / 10))
    assert _seconds_until_admitted(10, 60, 0.5, 20, 0) == pytest.approx(30 + 30)
    # Full because of the previous window: admitted once its weight has decayed enough.
    assert _seconds_until_admitted(10, 60, 0.0, 0, 20) == pytest.approx(30)
    assert _seconds_until_admitted(10, 60, 0.25, 5, 10) == pytest.approx(15)
