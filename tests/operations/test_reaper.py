"""The reaper in-process: idle vs active, max lifetime, pre-stop hook, compare-and-set."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from sandboxes import operations
from sandboxes.caller import PLATFORM
from sandboxes.models import Sandbox, SandboxState
from sandboxes.process_services import sandbox_process_start
from sandboxes.providers import get_provider
from sandboxes.services import sandbox_destroy, sandbox_touch_id

from .conftest import provider_has

pytestmark = pytest.mark.django_db


def test_idle_sandbox_is_reaped_and_active_ones_are_kept(make_sandbox):
    idle = make_sandbox(idle_s=120, timeout_s=60)
    recent = make_sandbox(idle_s=30, timeout_s=60)
    # Idle by the clock, but a terminal keystroke just touched it (what the consumer calls).
    typed = make_sandbox(idle_s=120, timeout_s=60)
    Sandbox.objects.filter(pk=typed.pk).update(
        last_activity_at=timezone.now() - timedelta(seconds=10)
    )
    sandbox_touch_id(typed.pk)

    report = operations.reap_sandboxes()

    assert report.reaped_idle == [idle.id]
    idle.refresh_from_db()
    assert (idle.state, idle.destroy_reason) == (SandboxState.DESTROYED, "idle")
    assert idle.destroyed_at is not None
    assert not provider_has("local", idle.provider_id)
    for kept in (recent, typed):
        kept.refresh_from_db()
        assert kept.state == SandboxState.RUNNING
        assert provider_has("local", kept.provider_id)


def test_running_user_process_counts_as_activity(make_sandbox):
    busy = make_sandbox(idle_s=600, timeout_s=60)
    sandbox_process_start(caller=PLATFORM, sandbox=busy, command="sleep 300")
    Sandbox.objects.filter(pk=busy.pk).update(
        last_activity_at=timezone.now() - timedelta(seconds=600)
    )

    report = operations.reap_sandboxes()

    assert report.kept_alive == [busy.id]
    busy.refresh_from_db()
    assert busy.state == SandboxState.RUNNING
    assert busy.last_activity_at > timezone.now() - timedelta(seconds=30)


def test_max_lifetime_is_reaped_even_when_active(make_sandbox):
    old = make_sandbox(timeout_s=3600)
    sandbox_process_start(caller=PLATFORM, sandbox=old, command="sleep 300")
    Sandbox.objects.filter(pk=old.pk).update(expires_at=timezone.now() - timedelta(seconds=1))

    report = operations.reap_sandboxes()

    assert report.reaped_max_lifetime == [old.id]
    old.refresh_from_db()
    assert (old.state, old.destroy_reason) == (SandboxState.DESTROYED, "max_lifetime")
    assert not provider_has("local", old.provider_id)


def test_pre_stop_hook_runs_before_the_reap(make_sandbox):
    sandbox = make_sandbox(
        idle_s=120, timeout_s=60, metadata={"pre_stop_hook": "echo saved > hook-ran.txt"}
    )
    provider = get_provider("local")
    seen: dict[str, bytes] = {}
    real_destroy = provider.destroy

    def destroy_spy(provider_id: str) -> bool:
        seen["file"] = provider.read_file(provider_id, "hook-ran.txt")
        return real_destroy(provider_id)

    provider.destroy = destroy_spy  # type: ignore[method-assign]
    try:
        assert operations.reap_sandboxes().reaped_idle == [sandbox.id]
    finally:
        del provider.destroy
    assert seen["file"] == b"saved\n"


def test_a_failing_hook_does_not_block_the_reap(make_sandbox, settings):
    settings.SANDPIT_PRE_STOP_HOOK = "exit 3"
    sandbox = make_sandbox(idle_s=120, timeout_s=60)
    assert operations.reap_sandboxes().reaped_idle == [sandbox.id]


def test_activity_between_check_and_commit_wins(make_sandbox):
    sandbox = make_sandbox(idle_s=120, timeout_s=60)
    stale_view = Sandbox.objects.get(pk=sandbox.pk)
    sandbox_touch_id(sandbox.pk)  # a keystroke lands after the reaper looked

    assert not sandbox_destroy(sandbox=stale_view, reason="idle", only_if_idle=True)
    sandbox.refresh_from_db()
    assert sandbox.state == SandboxState.RUNNING
    assert provider_has("local", sandbox.provider_id)


def test_one_failing_sandbox_does_not_stop_the_run(make_sandbox, monkeypatch):
    broken = make_sandbox(idle_s=300, timeout_s=60)
    fine = make_sandbox(idle_s=120, timeout_s=60)
    provider = get_provider("local")
    real = provider.list_processes

    def list_processes(provider_id: str):  # type: ignore[no-untyped-def]
        if provider_id == broken.provider_id:
            raise RuntimeError("boom")
        return real(provider_id)

    monkeypatch.setattr(provider, "list_processes", list_processes)
    report = operations.reap_sandboxes()
    assert report.failed == [broken.id]
    assert report.reaped_idle == [fine.id]


def test_reaping_twice_does_nothing_more(make_sandbox):
    sandbox = make_sandbox(idle_s=120, timeout_s=60)
    assert operations.reap_sandboxes().reaped_idle == [sandbox.id]
    again = operations.reap_sandboxes()
    assert again.reaped_idle == [] and again.failed == []
