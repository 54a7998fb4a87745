"""flush_usage: exact under crashes, concurrency and re-runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.db import connection
from django.db.models import Sum

from accounts.models import Organization
from billing import ledger, metering, pricing, services
from billing.metering import metering_authorize, metering_record
from billing.models import UsageDaily, UsageEvent
from billing.selectors import usage_summary
from tests.requirements import missing_part

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]


def daily_total(org: Organization) -> int:
    return UsageDaily.objects.filter(organization=org).aggregate(n=Sum("count"))["n"] or 0


def stream_length() -> int:
    meter = metering.get_meter()
    assert isinstance(meter, metering.RedisMeter)
    return meter.backlog()


@pytest.fixture
def redis_mode(settings):  # type: ignore[no-untyped-def]
    if not settings.REDIS_URL:
        missing_part("REDIS_URL is not set")


def test_flush_killed_after_commit_before_ack_then_rerun_is_exact(
    redis_mode, org_a, org_b, monkeypatch
):  # type: ignore[no-untyped-def]
    for index in range(500):
        org = org_a if index % 2 else org_b
        metering_record(organization_id=org.pk, api_key_id=index % 3, operation="command")

    def crash(self, entry_ids):  # type: ignore[no-untyped-def]
        raise RuntimeError("worker killed between the database commit and the ack")

    monkeypatch.setattr(metering.RedisMeter, "ack", crash)
    with pytest.raises(RuntimeError):
        services.usage_flush(batch_size=200)
    assert UsageEvent.objects.count() == 200  # the first batch committed, then "died"
    assert stream_length() == 500  # nothing acknowledged
    # Mid-crash, usage shown to customers is still exact (ledger + stream, deduplicated).
    assert usage_summary(organization=org_a).executions == 250
    monkeypatch.undo()

    result = services.usage_flush(batch_size=200)
    assert (result.read, result.added) == (500, 300)
    assert UsageEvent.objects.count() == 500
    assert (daily_total(org_a), daily_total(org_b)) == (250, 250)
    assert stream_length() == 0
    assert services.usage_flush().read == 0


def test_flush_failing_inside_the_transaction_writes_nothing(redis_mode, org_a, monkeypatch):  # type: ignore[no-untyped-def]
    for _ in range(50):
        metering_record(organization_id=org_a.pk, api_key_id=None, operation="command")

    def crash(counts):  # type: ignore[no-untyped-def]
        raise RuntimeError("database went away mid-transaction")

    monkeypatch.setattr(metering, "daily_add", crash)
    with pytest.raises(RuntimeError):
        services.usage_flush()
    assert UsageEvent.objects.count() == 0 and daily_total(org_a) == 0
    monkeypatch.undo()
    services.usage_flush()
    assert UsageEvent.objects.count() == 50 and daily_total(org_a) == 50


_FLUSH_CHILD = """
import django, os
django.setup()
from billing import services
print("started", flush=True)
while services.usage_flush(batch_size=int(os.environ["BATCH"]), max_batches=1).read:
    pass
print("done", flush=True)
"""


def test_flush_process_sigkilled_midway_then_rerun_is_exact(redis_mode, org_a, settings):  # type: ignore[no-untyped-def]
    total = 20_000
    meter = metering.get_meter()
    assert isinstance(meter, metering.RedisMeter)
    now = datetime.now(UTC)
    for chunk in range(0, total, 2000):
        meter.record_many(
            [
                ledger.MeteredEvent(f"e{i}", org_a.pk, i % 4, "command", now)
                for i in range(chunk, chunk + 2000)
            ]
        )
    assert stream_length() == total

    db = connection.settings_dict
    env = dict(
        os.environ,
        DATABASE_URL=f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        REDIS_URL=settings.REDIS_URL,
        SANDPIT_INSTALLATION=settings.SANDPIT_INSTALLATION,
        DJANGO_SETTINGS_MODULE="playground.settings",
        BATCH="500",
    )
    child = subprocess.Popen(
        [sys.executable, "-c", _FLUSH_CHILD], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "started"
    deadline = time.monotonic() + 30
    while UsageEvent.objects.count() < total // 4 and time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    flushed_when_killed = UsageEvent.objects.count()
    assert 0 < flushed_when_killed < total, flushed_when_killed

    # The dead worker's lock would expire after its lease; expire it now.
    meter.client.delete(meter.flush_lock)
    services.usage_flush()
    assert UsageEvent.objects.count() == total
    assert daily_total(org_a) == total
    assert dict(UsageDaily.objects.values_list("api_key_ref", "count")) == {
        0: 5000,
        1: 5000,
        2: 5000,
        3: 5000,
    }
    assert stream_length() == 0


def _hammer(
    organization_id: int, key_ids: list[int], calls: int, errors: list[BaseException]
) -> None:
    try:
        for call in range(calls):
            metering_record(
                organization_id=organization_id,
                api_key_id=key_ids[call % len(key_ids)],
                operation="command",
            )
    except BaseException as exc:  # noqa: BLE001
        errors.append(exc)
    finally:
        connection.close()


def test_32_threads_x_200_records_with_a_concurrent_flusher_count_exactly_6400(redis_mode, org_a):  # type: ignore[no-untyped-def]
    errors: list[BaseException] = []
    stop = threading.Event()

    def flusher() -> None:
        try:
            while not stop.is_set():
                services.usage_flush(batch_size=300)
                time.sleep(0.002)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connection.close()

    keys = [11, 12, 13, 14]
    threads = [
        threading.Thread(target=_hammer, args=(org_a.pk, keys, 200, errors)) for _ in range(32)
    ]
    background = threading.Thread(target=flusher)
    background.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stop.set()
    background.join()
    assert errors == []
    services.usage_flush()
    assert UsageEvent.objects.filter(organization=org_a).count() == 6400
    assert daily_total(org_a) == 6400
    assert Counter(
        dict(UsageDaily.objects.values_list("api_key_ref").annotate(n=Sum("count")))
    ) == {
        11: 1600,
        12: 1600,
        13: 1600,
        14: 1600,
    }
    state = metering.get_meter().period_state(
        org_a.pk, pricing.period_start(datetime.now(UTC)), datetime.now(UTC)
    )
    assert state.executions == 6400
    assert usage_summary(organization=org_a).executions == 6400


def test_two_flushes_at_once_do_not_double_count(redis_mode, org_a, monkeypatch):  # type: ignore[no-untyped-def]
    for _ in range(3000):
        metering_record(organization_id=org_a.pk, api_key_id=None, operation="command")
    # Defeat the flush lock so two flushes really overlap on the same entries.
    monkeypatch.setattr("redis.lock.Lock.acquire", lambda self, *a, **k: True)
    monkeypatch.setattr("redis.lock.Lock.release", lambda self: None)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            services.usage_flush(batch_size=250)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    services.usage_flush()
    assert UsageEvent.objects.count() == 3000
    assert daily_total(org_a) == 3000


def test_embedded_mode_concurrent_records_are_exact(settings, free_org):  # type: ignore[no-untyped-def]
    settings.REDIS_URL = ""
    errors: list[BaseException] = []
    threads = [
        threading.Thread(target=_hammer, args=(free_org.pk, [1, 2], 50, errors)) for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert UsageEvent.objects.count() == 400
    assert usage_summary(organization=free_org).executions == 400  # before any flush
    assert services.usage_flush().read == 400
    assert daily_total(free_org) == 400
    assert UsageEvent.objects.filter(aggregated_at__isnull=True).count() == 0
    assert services.usage_flush().read == 0
    assert usage_summary(organization=free_org).executions == 400
    with pytest.raises(metering.PaymentRequired):
        settings.SANDPIT_FREE_MONTHLY_EXECUTIONS = 400
        settings.SANDPIT_INSTALLATION += "-fresh-cache"
        metering_authorize(organization=free_org, feature="exec")


def test_events_of_a_deleted_organization_are_dropped_not_stuck(redis_mode, org_a, org_b):  # type: ignore[no-untyped-def]
    metering_record(organization_id=org_a.pk, api_key_id=None, operation="command")
    metering_record(organization_id=org_b.pk, api_key_id=None, operation="command")
    org_b.delete()
    services.usage_flush()
    assert stream_length() == 0
    assert list(UsageEvent.objects.values_list("organization_id", flat=True)) == [org_a.pk]


def test_ledger_insert_reports_only_new_rows(db, org_a):  # type: ignore[no-untyped-def]
    now = datetime.now(UTC)
    events = [ledger.MeteredEvent(f"id{i}", org_a.pk, None, "x", now) for i in range(3)]
    assert len(ledger.ledger_insert(events, aggregated_at=None)) == 3
    assert [
        e.event_id
        for e in ledger.ledger_insert(
            events + events[:1] + [ledger.MeteredEvent("id9", org_a.pk, None, "x", now)],
            aggregated_at=None,
        )
    ] == ["id9"]
