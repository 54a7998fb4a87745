"""metering_authorize / metering_record, with Redis and in embedded (database) mode."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from accounts.models import Organization
from billing import metering, pricing, services, usage_spool
from billing.ledger import (
    MeteredEvent,
    daily_add,
    daily_counts,
    ledger_insert,
    usage_count_in_ledger,
)
from billing.metering import metering_authorize, metering_record
from billing.models import PlanChange, UsageDaily, UsageEvent
from billing.selectors import usage_summary
from tests.requirements import missing_part

pytestmark = pytest.mark.django_db(transaction=True)


def daily_total(org: Organization) -> int:
    return UsageDaily.objects.filter(organization=org).aggregate(n=Sum("count"))["n"] or 0


def test_free_allowance_boundary_1000th_passes_1001st_gets_402(meter_mode, free_org):  # type: ignore[no-untyped-def]
    for _ in range(1000):
        metering_authorize(organization=free_org, feature="exec")
        metering_record(organization_id=free_org.pk, api_key_id=None, operation="command")
    with pytest.raises(metering.FreeAllowanceExhausted) as refused:
        metering_authorize(organization=free_org, feature="files")
    assert refused.value.status_code == 402
    assert refused.value.code == "free_allowance_exhausted"
    assert "1,000" in refused.value.message and "Premium" in refused.value.message
    services.usage_flush()
    assert (
        usage_count_in_ledger(
            organization_id=free_org.pk, start=pricing.period_start(datetime.now(UTC))
        )
        == 1000
    )


def test_allowance_counts_executions_recorded_before_a_restart(meter_mode, free_org, settings):  # type: ignore[no-untyped-def]
    settings.SANDPIT_FREE_MONTHLY_EXECUTIONS = 5
    for _ in range(5):
        metering_record(organization_id=free_org.pk, api_key_id=None, operation="command")
    services.usage_flush()
    # A new installation prefix = empty cache/Redis counters: authorize must re-seed from the DB
    # (the ledger rows already carry the organization; only the hot-path counter is lost).
    settings.SANDPIT_INSTALLATION += "-restarted"
    with pytest.raises(metering.FreeAllowanceExhausted):
        metering_authorize(organization=free_org, feature="exec")


def test_premium_feature_on_free_plan_gets_402_naming_premium(meter_mode, free_org):  # type: ignore[no-untyped-def]
    for feature in sorted(metering.PREMIUM_FEATURES):
        with pytest.raises(metering.PremiumRequired) as refused:
            metering_authorize(organization=free_org, feature=feature)
        assert refused.value.status_code == 402
        assert refused.value.code == "premium_required"
        assert feature in refused.value.message and "Premium" in refused.value.message
    for feature in sorted(metering.FREE_FEATURES):
        metering_authorize(organization=free_org, feature=feature)


def test_premium_without_cap_is_never_refused(meter_mode, org_a, settings):  # type: ignore[no-untyped-def]
    settings.SANDPIT_FREE_MONTHLY_EXECUTIONS = 3
    for _ in range(10):
        metering_record(organization_id=org_a.pk, api_key_id=None, operation="command")
    metering_authorize(organization=org_a, feature="terminal")
    metering_authorize(organization=org_a, feature="exec")


def test_unknown_feature_is_a_programming_error(meter_mode, org_a):  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError):
        metering_authorize(organization=org_a, feature="teleport")


def test_spending_cap_refuses_the_execution_that_would_exceed_it(meter_mode, org_a, monkeypatch):  # type: ignore[no-untyped-def]
    # 10 included executions instead of 100,000 so the cap is reached in a few calls:
    # 25 executions cost 9700 + round(15 × 0.097 = 1.455) = 9701¢, 26 would cost 9702¢.
    monkeypatch.setattr(pricing, "PREMIUM_INCLUDED_EXECUTIONS", 10)
    org_a.spending_cap_cents = 9_701
    org_a.save()
    for _ in range(25):
        metering_authorize(organization=org_a, feature="exec")
        metering_record(organization_id=org_a.pk, api_key_id=None, operation="command")
    with pytest.raises(metering.SpendingCapReached) as refused:
        metering_authorize(organization=org_a, feature="exec")
    assert refused.value.status_code == 402
    assert refused.value.code == "spending_cap_reached"
    assert "$97.01" in refused.value.message
    services.organization_spending_cap_set(organization=org_a, cap_cents=10_000)
    metering_authorize(organization=org_a, feature="exec")
    services.organization_spending_cap_set(organization=org_a, cap_cents=None)
    metering_authorize(organization=org_a, feature="exec")


def test_cap_below_premium_base_fee_refuses_everything(meter_mode, org_a):  # type: ignore[no-untyped-def]
    org_a.spending_cap_cents = 5_000
    with pytest.raises(metering.SpendingCapReached):
        metering_authorize(organization=org_a, feature="exec")


def test_period_boundary_at_utc_midnight_month_end(meter_mode, org_a):  # type: ignore[no-untyped-def]
    last_instant = datetime(2025, 1, 31, 23, 59, 59, 999000, tzinfo=UTC)
    first_instant = datetime(2025, 2, 1, 0, 0, 0, tzinfo=UTC)
    metering_record(
        organization_id=org_a.pk, api_key_id=7, operation="command", occurred_at=last_instant
    )
    metering_record(
        organization_id=org_a.pk, api_key_id=7, operation="command", occurred_at=first_instant
    )
    services.usage_flush()
    january, february = pricing.period_start(last_instant), pricing.period_start(first_instant)
    assert usage_count_in_ledger(organization_id=org_a.pk, start=january) == 1
    assert usage_count_in_ledger(organization_id=org_a.pk, start=february) == 1
    assert dict(UsageDaily.objects.filter(organization=org_a).values_list("day", "count")) == {
        last_instant.date(): 1,
        first_instant.date(): 1,
    }
    assert UsageEvent.objects.get(occurred_at=last_instant).occurred_at == last_instant
    assert usage_summary(organization=org_a, now=last_instant).executions == 1
    assert usage_summary(organization=org_a, now=first_instant).executions == 1


def test_same_event_id_is_counted_once_ever(meter_mode, org_a, settings):  # type: ignore[no-untyped-def]
    for _ in range(3):
        metering_record(
            organization_id=org_a.pk, api_key_id=None, operation="command", event_id="evt-1"
        )
    services.usage_flush()
    metering_record(
        organization_id=org_a.pk, api_key_id=None, operation="command", event_id="evt-1"
    )
    # Even once Redis has forgotten the id (TTL, restart), the ledger's unique constraint holds.
    settings.SANDPIT_INSTALLATION += "-forgetful"
    metering_record(
        organization_id=org_a.pk, api_key_id=None, operation="command", event_id="evt-1"
    )
    services.usage_flush()
    assert UsageEvent.objects.filter(event_id="evt-1").count() == 1
    assert daily_total(org_a) == 1


def test_long_event_ids_are_hashed_not_truncated(meter_mode, org_a):  # type: ignore[no-untyped-def]
    base = "idem:" + "k" * 200
    metering_record(organization_id=org_a.pk, api_key_id=None, operation="x", event_id=base + "1")
    metering_record(organization_id=org_a.pk, api_key_id=None, operation="x", event_id=base + "2")
    services.usage_flush()
    assert UsageEvent.objects.filter(organization=org_a).count() == 2


def test_usage_summary_includes_unflushed_executions(meter_mode, org_a, key_a):  # type: ignore[no-untyped-def]
    key_id = org_a.api_keys.get().pk
    for _ in range(3):
        metering_record(organization_id=org_a.pk, api_key_id=key_id, operation="command")
    services.usage_flush()
    for _ in range(2):
        metering_record(organization_id=org_a.pk, api_key_id=None, operation="command")
    summary = usage_summary(organization=org_a)
    assert summary.executions == 5
    assert {(k.api_key_id, k.executions) for k in summary.by_key} == {(key_id, 3), (None, 2)}
    assert summary.by_day[-1][1] == 5
    assert summary.amount_so_far_cents == 9_700


def test_downgrade_takes_effect_at_the_next_period_start(meter_mode, org_a, alice):  # type: ignore[no-untyped-def]
    mid_january = datetime(2025, 1, 15, 12, tzinfo=UTC)
    state = services.organization_plan_change(
        organization=org_a, plan="free", requested_by=alice, now=mid_january
    )
    assert (state.plan, state.scheduled_plan) == ("premium", "free")
    assert state.scheduled_at == datetime(2025, 2, 1, tzinfo=UTC)
    metering_authorize(
        organization=org_a, feature="terminal", now=datetime(2025, 1, 31, 23, 59, tzinfo=UTC)
    )
    org = Organization.objects.get(pk=org_a.pk)
    with pytest.raises(metering.PremiumRequired):
        metering_authorize(
            organization=org, feature="terminal", now=datetime(2025, 2, 1, 0, 0, 1, tzinfo=UTC)
        )
    assert Organization.objects.get(pk=org_a.pk).plan == "free"
    assert PlanChange.objects.get(organization=org_a).applied_at is not None


def test_upgrade_takes_effect_immediately(meter_mode, free_org, charlie):  # type: ignore[no-untyped-def]
    with pytest.raises(metering.PremiumRequired):
        metering_authorize(organization=free_org, feature="terminal")
    services.organization_plan_change(organization=free_org, plan="premium", requested_by=charlie)
    metering_authorize(organization=free_org, feature="terminal")
    assert Organization.objects.get(pk=free_org.pk).plan == "premium"


def test_reupgrade_cancels_a_scheduled_downgrade(meter_mode, org_a, alice):  # type: ignore[no-untyped-def]
    services.organization_plan_change(organization=org_a, plan="free", requested_by=alice)
    state = services.organization_plan_change(
        organization=org_a, plan="premium", requested_by=alice
    )
    assert (state.plan, state.scheduled_plan) == ("premium", None)
    assert PlanChange.objects.get(organization=org_a).canceled_at is not None


def test_counter_is_reseeded_exactly_after_redis_loses_its_data(org_a, settings):  # type: ignore[no-untyped-def]
    import redis

    if not settings.REDIS_URL:
        missing_part("REDIS_URL is not set")
    settings.SANDPIT_FREE_MONTHLY_EXECUTIONS = 32
    org_a.plan = "free"
    for _ in range(30):
        metering_record(organization_id=org_a.pk, api_key_id=None, operation="command")
    services.usage_flush()
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(*client.scan_iter(match=f"{metering.key_prefix()}:*"))  # Redis restarted empty
    for _ in range(2):  # recorded after the restart: in the new counter, not in the seed
        metering_record(organization_id=org_a.pk, api_key_id=None, operation="command")
    services.usage_flush()  # and flushed before the first authorize: still not counted twice
    with pytest.raises(metering.FreeAllowanceExhausted):
        metering_authorize(organization=org_a, feature="exec")
    start = pricing.period_start(datetime.now(UTC))
    assert metering.get_meter().period_state(org_a.pk, start, datetime.now(UTC)).executions == 32


def test_an_event_a_flush_committed_but_has_not_acknowledged_counts_once(org_a, settings):  # type: ignore[no-untyped-def]
    """Between a flush's commit and its acknowledgement an event is both in Redis and in the
    rollup: the usage read counts it once."""
    if not settings.REDIS_URL:
        missing_part("REDIS_URL is not set")
    for _ in range(3):
        metering_record(organization_id=org_a.pk, api_key_id=None, operation="command")
    meter = metering.get_meter()
    assert isinstance(meter, metering.RedisMeter)
    batch = meter.read_batch(100)
    events = [event for _, event in batch if event is not None]
    assert len(events) == 3
    with transaction.atomic():  # the flush's commit, without its acknowledgement
        daily_add(daily_counts(ledger_insert(events, aggregated_at=timezone.now())))
    assert usage_summary(organization=org_a).executions == 3
    meter.ack([entry_id for entry_id, _ in batch])
    assert usage_summary(organization=org_a).executions == 3


def test_records_kept_on_disk_count_at_once_and_once_after_the_flush(org_a, settings, tmp_path):  # type: ignore[no-untyped-def]
    """Embedded mode: usage records the database could not take (billing/usage_spool.py)."""
    settings.REDIS_URL = ""
    settings.VAR_DIR = tmp_path
    kept = [MeteredEvent(f"kept-{n}", org_a.pk, None, "command", timezone.now()) for n in range(2)]
    for event in kept:
        usage_spool.spool_write(event)
    usage_spool.spool_write(kept[0])  # a retry of one event: still one record
    assert len(list(usage_spool.spooled())) == 2
    assert usage_summary(organization=org_a).executions == 2
    with transaction.atomic():  # a flush that moved one and stopped before removing it
        ledger_insert(kept[:1], aggregated_at=None)
    assert usage_summary(organization=org_a).executions == 2
    (tmp_path / "usage-spool" / "torn.json").write_text('{"event_id": ')
    services.usage_flush()
    assert [path.name for path in (tmp_path / "usage-spool").iterdir()] == ["torn.json"]
    assert UsageEvent.objects.filter(event_id__startswith="kept-").count() == 2
    assert usage_summary(organization=org_a).executions == 2
    assert daily_total(org_a) == 2
