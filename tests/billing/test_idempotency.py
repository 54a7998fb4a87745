"""Idempotency-Key: one run and one count per key; replay, 409 while in flight, 422 on reuse."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from billing import idempotency, services
from billing.idempotency import (
    StoredResponse,
    idempotency_abort,
    idempotency_begin,
    idempotency_complete,
)
from billing.metering import metering_authorize, metering_record
from billing.models import IdempotencyRecord, UsageEvent
from common.errors import ApplicationError, Conflict

pytestmark = pytest.mark.django_db(transaction=True)
RESPONSE = StoredResponse(status_code=201, body=b'{"ok": true}', content_type="application/json")


def metered_call(org, key: str, fingerprint: str, runs: list[int]) -> StoredResponse:  # type: ignore[no-untyped-def]
    """The sandbox API's sequence for a metered request with an Idempotency-Key."""
    stored = idempotency_begin(organization_id=org.pk, key=key, fingerprint=fingerprint)
    if stored is not None:
        return stored
    metering_authorize(organization=org, feature="exec")
    runs.append(1)
    metering_record(
        organization_id=org.pk,
        api_key_id=None,
        operation="command",
        event_id=f"idem:{org.pk}:{key}",
    )
    idempotency_complete(organization_id=org.pk, key=key, response=RESPONSE)
    return RESPONSE


def test_same_key_same_body_runs_and_counts_once_and_replays(meter_mode, org_a):  # type: ignore[no-untyped-def]
    runs: list[int] = []
    first = metered_call(org_a, "k1", "fp", runs)
    second = metered_call(org_a, "k1", "fp", runs)
    assert first == second == RESPONSE
    assert runs == [1]
    services.usage_flush()
    assert UsageEvent.objects.filter(organization=org_a).count() == 1


def test_same_key_different_body_is_422(org_a):  # type: ignore[no-untyped-def]
    assert idempotency_begin(organization_id=org_a.pk, key="k", fingerprint="fp1") is None
    idempotency_complete(organization_id=org_a.pk, key="k", response=RESPONSE)
    with pytest.raises(ApplicationError) as refused:
        idempotency_begin(organization_id=org_a.pk, key="k", fingerprint="fp2")
    assert (refused.value.status_code, refused.value.code) == (422, "idempotency_key_reused")


def test_key_in_flight_is_409(org_a):  # type: ignore[no-untyped-def]
    assert idempotency_begin(organization_id=org_a.pk, key="k", fingerprint="fp") is None
    with pytest.raises(Conflict) as refused:
        idempotency_begin(organization_id=org_a.pk, key="k", fingerprint="fp")
    assert (refused.value.status_code, refused.value.code) == (409, "idempotency_in_progress")


def test_abort_frees_the_key_for_a_retry(org_a):  # type: ignore[no-untyped-def]
    assert idempotency_begin(organization_id=org_a.pk, key="k", fingerprint="fp") is None
    idempotency_abort(organization_id=org_a.pk, key="k")
    assert idempotency_begin(organization_id=org_a.pk, key="k", fingerprint="fp") is None


def test_keys_are_per_organization(org_a, org_b):  # type: ignore[no-untyped-def]
    assert idempotency_begin(organization_id=org_a.pk, key="k", fingerprint="fp") is None
    assert idempotency_begin(organization_id=org_b.pk, key="k", fingerprint="other") is None


def test_a_key_abandoned_in_flight_is_taken_over_after_the_lease(org_a):  # type: ignore[no-untyped-def]
    assert idempotency_begin(organization_id=org_a.pk, key="k", fingerprint="fp") is None
    IdempotencyRecord.objects.update(
        created_at=timezone.now() - idempotency.IN_FLIGHT_LEASE - timedelta(seconds=1)
    )
    assert idempotency_begin(organization_id=org_a.pk, key="k", fingerprint="fp") is None
    with pytest.raises(Conflict):
        idempotency_begin(organization_id=org_a.pk, key="k", fingerprint="fp")


def test_a_crash_after_counting_then_a_retry_is_still_counted_once(meter_mode, org_a):  # type: ignore[no-untyped-def]
    """The worker died after metering_record but before idempotency_complete: the retry (after
    the lease) runs again, but records the same event id, so the execution counts once."""
    assert idempotency_begin(organization_id=org_a.pk, key="k", fingerprint="fp") is None
    metering_record(
        organization_id=org_a.pk,
        api_key_id=None,
        operation="command",
        event_id=f"idem:{org_a.pk}:k",
    )
    IdempotencyRecord.objects.update(
        created_at=timezone.now() - idempotency.IN_FLIGHT_LEASE - timedelta(seconds=1)
    )
    metered_call(org_a, "k", "fp", [])
    services.usage_flush()
    assert UsageEvent.objects.filter(organization=org_a).count() == 1


def test_invalid_keys_are_400(org_a):  # type: ignore[no-untyped-def]
    for key in ("", "x" * 256):
        with pytest.raises(ApplicationError) as refused:
            idempotency_begin(organization_id=org_a.pk, key=key, fingerprint="fp")
        assert (refused.value.status_code, refused.value.code) == (400, "validation_error")


def test_stored_body_round_trips_as_bytes(org_a):  # type: ignore[no-untyped-def]
    idempotency_begin(organization_id=org_a.pk, key="k", fingerprint="fp")
    body = bytes(range(256))
    idempotency_complete(
        organization_id=org_a.pk,
        key="k",
        response=StoredResponse(200, body, "application/octet-stream"),
    )
    stored = idempotency_begin(organization_id=org_a.pk, key="k", fingerprint="fp")
    assert stored == StoredResponse(200, body, "application/octet-stream")


def test_purge_forgets_old_keys(org_a):  # type: ignore[no-untyped-def]
    idempotency_begin(organization_id=org_a.pk, key="old", fingerprint="fp")
    IdempotencyRecord.objects.update(created_at=timezone.now() - timedelta(days=2))
    idempotency_begin(organization_id=org_a.pk, key="new", fingerprint="fp")
    assert services.idempotency_purge(before=timezone.now() - timedelta(days=1)) == 1
    assert list(IdempotencyRecord.objects.values_list("key", flat=True)) == ["new"]
