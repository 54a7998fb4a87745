"""Crash safety and concurrency: a reaper SIGKILLed between its commit and the provider
destroy is completed by the next run; concurrent reapers never double-destroy."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from django.db import connection

from sandboxes import operations
from sandboxes.models import Sandbox, SandboxState
from sandboxes.providers import get_provider
from sandboxes.providers.base import SandboxSpec

from .conftest import provider_has
from .test_worker import ROOT, _database_url

pytestmark = pytest.mark.django_db(transaction=True)

CRASHING_REAPER = textwrap.dedent(
    """
    import pathlib, sys, time
    import django
    django.setup()
    from sandboxes.providers.local import LocalProvider

    def destroy(self, provider_id):
        # The row already says destroyed: signal the test, then hang until SIGKILL.
        pathlib.Path(sys.argv[1]).write_text(provider_id)
        time.sleep(120)

    LocalProvider.destroy = destroy
    from sandboxes import operations
    operations.reap_sandboxes(sweep_leftovers=False)
    """
)


def test_reaper_killed_mid_reap_is_completed_by_the_next_run(
    make_sandbox, ops_root, settings, tmp_path
):
    sandbox = make_sandbox(idle_s=120, timeout_s=60)
    marker = tmp_path / "committed"
    env = {
        **os.environ,
        "DATABASE_URL": _database_url(),
        "SANDPIT_PROVIDERS": "local",
        "SANDPIT_LOCAL_ROOT": str(ops_root),
        "DJANGO_SETTINGS_MODULE": "playground.settings",
    }
    proc = subprocess.Popen([sys.executable, "-c", CRASHING_REAPER, str(marker)], cwd=ROOT, env=env)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None, "the reaper exited before its commit point"
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()

    # Killed after the commit, before the provider call: row destroyed, resource alive.
    sandbox.refresh_from_db()
    assert (sandbox.state, sandbox.destroy_reason) == (SandboxState.DESTROYED, "idle")
    assert provider_has("local", sandbox.provider_id)

    # Within the grace period the next run leaves it (the killed worker might still be
    # finishing); after it, the next run completes the destroy.
    assert operations.reap_sandboxes().leftovers.orphans_destroyed == []
    settings.SANDPIT_ORPHAN_GRACE_S = 0
    report = operations.reap_sandboxes()
    assert report.leftovers.orphans_destroyed == [sandbox.provider_id]
    assert not provider_has("local", sandbox.provider_id)
    sandbox.refresh_from_db()
    assert (sandbox.state, sandbox.destroy_reason) == (SandboxState.DESTROYED, "idle")
    assert operations.reap_sandboxes().leftovers.orphans_destroyed == []


def test_concurrent_reapers_never_double_destroy(make_sandbox, monkeypatch):
    from django.utils import timezone

    idle = [make_sandbox(idle_s=120, timeout_s=60) for _ in range(4)]
    expired = [make_sandbox(timeout_s=3600) for _ in range(2)]
    Sandbox.objects.filter(pk__in=[s.pk for s in expired]).update(expires_at=timezone.now())
    provider = get_provider("local")
    real_destroy = provider.destroy
    destroyed: Counter[str] = Counter()
    lock = threading.Lock()

    def counting_destroy(provider_id: str) -> bool:
        result = real_destroy(provider_id)
        if result:
            with lock:
                destroyed[provider_id] += 1
        return result

    monkeypatch.setattr(provider, "destroy", counting_destroy)
    barrier = threading.Barrier(3)
    errors: list[BaseException] = []

    def reaper() -> None:
        try:
            barrier.wait()
            operations.reap_sandboxes()
        except BaseException as exc:  # noqa: BLE001 - surfaced by the assert below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=reaper) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert errors == []
    everyone = idle + expired
    assert destroyed == Counter({s.provider_id: 1 for s in everyone})
    states = dict(
        Sandbox.objects.filter(pk__in=[s.pk for s in everyone]).values_list("id", "destroy_reason")
    )
    assert states == {**{s.id: "idle" for s in idle}, **{s.id: "max_lifetime" for s in expired}}


def test_young_orphan_is_left_alone_for_an_in_flight_create(ops_providers):
    provider = get_provider("local")
    handle = provider.create(SandboxSpec(sandbox_id="sbx_being_created"))
    assert operations.reconcile_orphans().orphans_destroyed == []
    assert provider_has("local", handle.provider_id)


def test_stale_creating_row_is_cleaned(make_sandbox, settings):
    sandbox = make_sandbox(timeout_s=600)
    resource = sandbox.provider_id
    # The creating worker died after provider.create, before recording the provider id.
    Sandbox.objects.filter(pk=sandbox.pk).update(state=SandboxState.CREATING, provider_id="")
    settings.SANDPIT_CREATE_STALE_S = 0
    settings.SANDPIT_ORPHAN_GRACE_S = 0
    report = operations.reconcile_sandboxes()
    assert report.stale_creates == [sandbox.id]
    # Its resource, now owned by no live row, went as an orphan in the same run.
    assert report.orphans_destroyed == [resource]
    sandbox.refresh_from_db()
    assert (sandbox.state, sandbox.destroy_reason) == (SandboxState.DESTROYED, "create_interrupted")
    assert not Path(settings.SANDPIT_LOCAL_ROOT, resource).exists()
