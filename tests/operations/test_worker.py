"""Reaper and reconciler through a real Celery worker on the real Redis broker, against the
real local (bubblewrap) and Docker providers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from common import metrics
from sandboxes import tasks
from sandboxes.caller import PLATFORM
from sandboxes.models import Sandbox, SandboxState
from sandboxes.process_services import sandbox_process_start
from sandboxes.providers import get_provider
from sandboxes.providers.base import SandboxSpec
from tests.requirements import missing_part

from .conftest import INSTALLATION, docker_available, provider_has

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _real_broker() -> None:
    if not os.environ.get("REDIS_URL"):
        missing_part("needs REDIS_URL (a real broker)")


ROOT = Path(__file__).resolve().parents[2]


def _database_url() -> str:
    db = connection.settings_dict
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


@pytest.fixture(scope="module")
def worker(django_db_setup, django_db_blocker, ops_root, tmp_path_factory) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """`celery -A playground worker` on a queue of its own (other runs share this Redis),
    pointed at the test database. Yields the queue name."""
    queue = f"ops-test-{uuid.uuid4().hex[:8]}"
    with django_db_blocker.unblock():
        database_url = _database_url()
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "SANDPIT_PROVIDERS": "local,docker" if docker_available() else "local",
        "SANDPIT_LOCAL_ROOT": str(ops_root),
        "SANDPIT_INSTALLATION": INSTALLATION,
        "SANDPIT_ORPHAN_GRACE_S": "0",
        "DJANGO_SETTINGS_MODULE": "playground.settings",
    }
    log = tmp_path_factory.mktemp("worker") / "worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "playground", "worker", "--pool=solo",
             "-Q", queue, "--without-gossip", "--without-mingle", "--without-heartbeat",
             "--loglevel=INFO"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        yield queue
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if os.environ.get("SANDPIT_SHOW_WORKER_LOG"):
            sys.stderr.write(log.read_text())


def _runs(task: str) -> float:
    return sum(
        v for labels, v in metrics.counter_values("reaper_runs").items() if ("task", task) in labels
    )


def _run_task(task: Callable, queue: str, name: str, timeout_s: float = 60) -> None:  # type: ignore[type-arg]
    """Send through the broker and wait for the worker to finish it (its run counter)."""
    before = _runs(name)
    task.apply_async(queue=queue)
    deadline = time.monotonic() + timeout_s
    while _runs(name) <= before:
        assert time.monotonic() < deadline, f"the worker did not run {name} in {timeout_s}s"
        time.sleep(0.1)


@pytest.mark.docker
def test_worker_reaps_idle_local_and_docker_sandboxes_and_keeps_active_ones(worker, make_sandbox):
    idle_local = make_sandbox("local", idle_s=120, timeout_s=60)
    idle_docker = make_sandbox("docker", idle_s=120, timeout_s=60)
    recent = make_sandbox("local", idle_s=10, timeout_s=60)
    busy = make_sandbox("docker", idle_s=600, timeout_s=60)
    sandbox_process_start(caller=PLATFORM, sandbox=busy, command="sleep 300")
    Sandbox.objects.filter(pk=busy.pk).update(
        last_activity_at=timezone.now() - timedelta(seconds=600)
    )
    reaped_before = metrics.counter_values("sandboxes_reaped").get((("reason", "idle"),), 0)

    _run_task(tasks.reap_sandboxes, worker, "reap")

    for sandbox in (idle_local, idle_docker):
        sandbox.refresh_from_db()
        assert (sandbox.state, sandbox.destroy_reason) == (SandboxState.DESTROYED, "idle")
        assert not provider_has(sandbox.provider, sandbox.provider_id)
    for sandbox in (recent, busy):
        sandbox.refresh_from_db()
        assert sandbox.state == SandboxState.RUNNING
        assert provider_has(sandbox.provider, sandbox.provider_id)
    busy.refresh_from_db()
    assert busy.last_activity_at > timezone.now() - timedelta(seconds=60)
    reaped_after = metrics.counter_values("sandboxes_reaped").get((("reason", "idle"),), 0)
    assert reaped_after - reaped_before >= 2


@pytest.mark.docker
def test_worker_reconciles_orphans_and_vanished_rows(worker, make_sandbox):
    # A container started behind the app's back, wearing the app's labels.
    ghost = subprocess.run(
        ["docker", "run", "-d", "--network", "none",
         "--label", "sandpit.managed=1", "--label", f"sandpit.installation={INSTALLATION}",
         "--label", "sandpit.sandbox_id=sbx_never_created",
         os.environ.get("SANDPIT_DOCKER_IMAGE", "sandpit-sandbox:latest")],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    # A local jail with no row at all.
    local_ghost = get_provider("local").create(SandboxSpec(sandbox_id="sbx_local_ghost"))
    # A live row whose resource vanished (killed outside Sandpit).
    vanished = make_sandbox("local", timeout_s=600)
    get_provider("local").destroy(vanished.provider_id)
    kept = make_sandbox("docker", timeout_s=600)

    _run_task(tasks.reconcile_sandboxes, worker, "reconcile")

    assert not provider_has("docker", ghost)
    assert not provider_has("local", local_ghost.provider_id)
    vanished.refresh_from_db()
    assert (vanished.state, vanished.destroy_reason) == (SandboxState.DESTROYED, "vanished")
    assert "no longer has" in vanished.error_message
    kept.refresh_from_db()
    assert kept.state == SandboxState.RUNNING
    assert provider_has("docker", kept.provider_id)
