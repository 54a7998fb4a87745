"""End to end: 32 HTTP clients × 100 metered calls against daphne on PostgreSQL + Redis
count exactly 3,200 executions (plus the sandbox's creation), none lost, none doubled
(BILLING_LIVE_CALLS=200 for the heavier run, 6,400)."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from django.db import connection

from accounts.models import Organization
from billing import services
from billing.models import UsageDaily, UsageEvent
from sandboxes.models import Sandbox
from sandboxes.services import CAPPED_STATES
from tests.requirements import missing_part
from tests.servers import serving_test_database

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]
logging.getLogger("httpx").setLevel(logging.WARNING)
CLIENTS, CALLS = 32, int(os.environ.get("BILLING_LIVE_CALLS", "100"))


@pytest.fixture
def server(served: tuple[str, Path]) -> str:
    return served[0]


@pytest.fixture
def served(transactional_db, settings, tmp_path) -> Iterator[tuple[str, Path]]:  # type: ignore[no-untyped-def]
    """daphne serving this test's database and Redis prefix on a free loopback port (its
    URL), and the root of its local sandboxes, with the default warm pool of 8 jails."""
    if not settings.REDIS_URL or connection.vendor != "postgresql":
        missing_part("needs PostgreSQL and REDIS_URL")
    with serving_test_database(
        settings, tmp_path / "daphne.log", module="daphne", SANDPIT_LOCAL_WARM_POOL="8"
    ) as served:
        yield served


def test_32_clients_x_100_metered_calls_count_exactly(server, org_a, key_a):  # type: ignore[no-untyped-def]
    headers = {"Authorization": f"Bearer {key_a}"}
    created = httpx.post(f"{server}/api/v1/sandboxes", json={}, headers=headers, timeout=60)
    assert created.status_code == 201, created.text
    sandbox_url = f"{server}/api/v1/sandboxes/{created.json()['id']}"
    # A retried request with one Idempotency-Key runs and counts once.
    retry_headers = {**headers, "Idempotency-Key": "retry-once-1"}
    first = httpx.post(
        f"{sandbox_url}/commands", json={"command": "echo hi"}, headers=retry_headers, timeout=60
    )
    second = httpx.post(
        f"{sandbox_url}/commands", json={"command": "echo hi"}, headers=retry_headers, timeout=60
    )
    assert first.status_code == second.status_code == 200, (first.text, second.text)
    assert first.content == second.content and second.headers.get("Idempotent-Replayed") == "true"
    reused = httpx.post(
        f"{sandbox_url}/commands", json={"command": "echo other"}, headers=retry_headers, timeout=60
    )
    assert reused.status_code == 422 and reused.json()["error"]["code"] == "idempotency_key_reused"

    statuses: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def client() -> None:
        mine: list[int] = []
        try:
            with httpx.Client(headers=headers, timeout=120) as http:  # keep-alive
                for _ in range(CALLS):
                    mine.append(
                        http.get(f"{sandbox_url}/files/stat", params={"path": "."}).status_code
                    )
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        with lock:
            statuses.extend(mine)

    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    assert errors == []
    assert statuses == [200] * (CLIENTS * CALLS), {s: statuses.count(s) for s in set(statuses)}
    print(
        f"\n{CLIENTS * CALLS} metered calls in {elapsed:.1f} s = {CLIENTS * CALLS / elapsed:.0f} req/s"
    )

    # Usage is current before any flush: unflushed executions are included.
    usage = httpx.get(f"{server}/api/v1/usage", headers=headers, timeout=30).json()
    assert usage["executions"] == 2 + CLIENTS * CALLS
    # Usage calls are billing pages: not counted.
    assert (
        httpx.get(f"{server}/api/v1/usage", headers=headers, timeout=30).json()["executions"]
        == 2 + CLIENTS * CALLS
    )

    # Refused before reaching a sandbox: not counted.
    assert (
        httpx.get(f"{sandbox_url}/files/stat", params={"path": "."}, timeout=30).status_code == 401
    )
    assert (
        httpx.get(
            f"{server}/api/v1/sandboxes/sbx_nope/files/stat",
            params={"path": "."},
            headers=headers,
            timeout=30,
        ).status_code
        == 404
    )

    services.usage_flush()
    expected = 1 + CLIENTS * CALLS + 1
    assert UsageEvent.objects.filter(organization=org_a).count() == expected
    assert (
        sum(UsageDaily.objects.filter(organization=org_a).values_list("count", flat=True))
        == expected
    )
    assert UsageDaily.objects.get(organization=org_a).api_key_ref == org_a.api_keys.get().pk
    assert (
        httpx.get(f"{server}/api/v1/usage", headers=headers, timeout=30).json()["executions"]
        == expected
    )
    httpx.delete(sandbox_url, headers=headers, timeout=60)


def test_racing_creates_stop_exactly_at_the_limit_and_only_those_count(server, org_a, key_a):  # type: ignore[no-untyped-def]
    """Through the server a create's limit check and insert are one statement sent outside
    any transaction (sandboxes/services.py sandbox_insert_capped): twelve creates at once
    against a limit of three leave exactly three, and only those are metered."""
    Organization.objects.filter(pk=org_a.pk).update(max_concurrent_sandboxes=3)
    headers = {"Authorization": f"Bearer {key_a}"}
    made = _twelve_creates_at_once_against_a_limit_of_three(server, headers)
    live = Sandbox.objects.filter(organization=org_a, state__in=CAPPED_STATES)
    assert sorted(live.values_list("pk", flat=True)) == sorted(made)
    services.usage_flush()
    assert UsageEvent.objects.filter(organization=org_a, operation="sandbox.create").count() == 3
    for sandbox_id in made:
        httpx.delete(f"{server}/api/v1/sandboxes/{sandbox_id}", headers=headers, timeout=60)


def _warm_jails(root: Path) -> set[str]:
    """The warm jails ready under `root` (each has written its state)."""
    return {path.name for path in root.glob("warm-*") if (path / "state.json").exists()}


def test_racing_creates_on_a_full_warm_pool_give_the_refused_ones_jails_back(served, org_a, key_a):  # type: ignore[no-untyped-def]
    """Twelve creates at once against a limit of three, on a full pool of eight: each that
    finds a warm jail sets it aside before its row is admitted, and the refused ones give
    theirs back unused (a tenant at its limit cannot burn the pool): of the eight jails
    idle before, all but those the made sandboxes adopted are still there after."""
    server, root = served
    Organization.objects.filter(pk=org_a.pk).update(max_concurrent_sandboxes=3)
    headers = {"Authorization": f"Bearer {key_a}"}
    first = httpx.post(f"{server}/api/v1/sandboxes", json={}, headers=headers, timeout=60)
    assert first.status_code == 201, first.text  # starts the pool
    assert httpx.delete(
        f"{server}/api/v1/sandboxes/{first.json()['id']}", headers=headers, timeout=60
    ).is_success
    deadline = time.monotonic() + 60
    while len(_warm_jails(root)) < 8:
        assert time.monotonic() < deadline, _warm_jails(root)
        time.sleep(0.1)
    time.sleep(0.5)  # the last one's agent answers shortly after its state is written
    before = _warm_jails(root)
    made = _twelve_creates_at_once_against_a_limit_of_three(server, headers)
    live = Sandbox.objects.filter(organization=org_a, state__in=CAPPED_STATES)
    assert sorted(live.values_list("pk", flat=True)) == sorted(made)
    assert all(sandbox.provider_id == sandbox.pk for sandbox in live)
    # A jail leaves the pool only as a made sandbox: the warm ones a made sandbox adopted
    # (its cgroups keep the pool jail's name), none that a refused create had set aside.
    adopted = {
        Path(path).name
        for sandbox_id in made
        for path in json.loads((root / sandbox_id / "state.json").read_text())["cgroups"].values()
        if "/warm-" in path
    }
    assert before - _warm_jails(root) == adopted and len(adopted) <= 3, (before, adopted)
    for sandbox_id in made:
        response = httpx.post(
            f"{server}/api/v1/sandboxes/{sandbox_id}/commands",
            json={"command": "echo $((6*7))"},
            headers=headers,
            timeout=60,
        )
        assert response.json()["stdout"] == "42\n", response.text
        httpx.delete(f"{server}/api/v1/sandboxes/{sandbox_id}", headers=headers, timeout=60)


def _twelve_creates_at_once_against_a_limit_of_three(
    server: str, headers: dict[str, str]
) -> list[str]:
    """Twelve clients, each connected first, create at once: exactly three are made (their
    ids) and nine refused with 'sandbox_limit_reached' naming the limit."""
    barrier = threading.Barrier(12)
    responses: list[httpx.Response] = []
    lock = threading.Lock()

    def create() -> None:
        with httpx.Client(headers=headers, timeout=60) as http:
            http.get(f"{server}/health/live")  # connected before the race
            barrier.wait(30)
            response = http.post(f"{server}/api/v1/sandboxes", json={})
        with lock:
            responses.append(response)

    threads = [threading.Thread(target=create) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    made = [r.json()["id"] for r in responses if r.status_code == 201]
    refused = [r.json()["error"] for r in responses if r.status_code == 429]
    assert len(made) == 3 and len(refused) == 9, [(r.status_code, r.text[:200]) for r in responses]
    assert {error["code"] for error in refused} == {"sandbox_limit_reached"}
    assert all("(limit 3)" in error["message"] for error in refused)
    return made
