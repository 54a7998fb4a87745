"""Snapshots, fork, pause and resume through the REST API, on the real local provider.

Covers: snapshot -> new sandbox from it (files back), the fork shortcut, pause (a counter
read twice while paused does not move; operations answer 409 sandbox_paused) and resume,
the concurrent cap counting paused but not archived sandboxes, the reaper archiving a long
paused sandbox and resume starting it again from the archive, per-organization limits,
cleanup of archive files (snapshot deleted, sandbox destroyed, organization deleted) and
another organization's ids answering 404."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.models import Organization
from sandboxes.models import Sandbox, Snapshot
from sandboxes.operations import reap_sandboxes
from sandboxes.providers.base import FileNotFound
from sandboxes.snapshot_store import ARCHIVE, MANUAL, archives_drop
from tests.conftest import assert_error
from tests.sandboxes.test_provider_contract import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

COUNTER = "i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.005; done"


@pytest.fixture(autouse=True)
def snapshot_dir(settings, tmp_path) -> Path:  # type: ignore[no-untyped-def]
    settings.SANDPIT_SNAPSHOT_DIR = tmp_path / "snapshots"
    return Path(settings.SANDPIT_SNAPSHOT_DIR)


def _archives(snapshot_dir: Path) -> list[str]:
    return sorted(p.name for p in snapshot_dir.rglob("*.tar.zst"))


def _write(api: Any, sandbox_id: str, path: str, data: bytes) -> None:
    response = api.put(
        f"/api/v1/sandboxes/{sandbox_id}/files/content?path={path}",
        data,
        content_type="application/octet-stream",
    )
    assert response.status_code < 300, response.content


def _count(provider: Any, sandbox_id: str) -> int:
    """COUNTER's last number, read host-side (needs no process of the sandbox); 0 before
    the counter first wrote it."""
    try:
        text = provider.read_file(sandbox_id, "/tmp/count").strip()
    except FileNotFound:
        return 0
    return int(text) if text else 0


def _read(api: Any, sandbox_id: str, path: str) -> bytes:
    response = api.get(f"/api/v1/sandboxes/{sandbox_id}/files/content?path={path}")
    assert response.status_code == 200, response.content
    return bytes(response.content)


def _post(api: Any, url: str, body: dict[str, Any] | None = None) -> Any:
    return api.post(url, body if body is not None else {}, format="json")


def test_snapshot_then_a_sandbox_from_it_has_the_files(api_a, sandbox_a, snapshot_dir):  # type: ignore[no-untyped-def]
    sid = sandbox_a["id"]
    _write(api_a, sid, "notes/a.txt", b"kept")
    _write(api_a, sid, "/tmp/scratch", b"tmp too")
    made = _post(api_a, f"/api/v1/sandboxes/{sid}/snapshots", {"name": "first"})
    assert made.status_code == 201, made.content
    snap = made.json()
    assert snap["state"] == "ready" and snap["kind"] == "manual" and snap["name"] == "first"
    assert snap["sandbox"] == sid and snap["size_bytes"] > 0
    assert _archives(snapshot_dir) == [f"{snap['id']}.tar.zst"]
    listed = api_a.get(f"/api/v1/sandboxes/{sid}/snapshots").json()["results"]
    assert [s["id"] for s in listed] == [snap["id"]]
    assert api_a.get(f"/api/v1/snapshots/{snap['id']}").json()["id"] == snap["id"]
    assert [s["id"] for s in api_a.get("/api/v1/snapshots").json()["results"]] == [snap["id"]]

    _write(api_a, sid, "notes/a.txt", b"changed later")  # the snapshot does not follow
    started = _post(api_a, "/api/v1/sandboxes", {"snapshot": snap["id"]})
    assert started.status_code == 201, started.content
    fork = started.json()
    assert fork["snapshot"] == snap["id"] and fork["provider"] == "local"
    assert _read(api_a, fork["id"], "notes/a.txt") == b"kept"
    assert _read(api_a, fork["id"], "/tmp/scratch") == b"tmp too"
    assert _read(api_a, sid, "notes/a.txt") == b"changed later"

    wrong = _post(api_a, "/api/v1/sandboxes", {"snapshot": snap["id"], "provider": "docker"})
    assert wrong.status_code in (400, 409)  # docker is not enabled here, or a mismatch

    # the shortcut: one request, its passing snapshot gone afterwards
    forked = _post(api_a, f"/api/v1/sandboxes/{sid}/fork")
    assert forked.status_code == 201, forked.content
    assert forked.json()["metadata"] == {"forked_from": sid}
    assert _read(api_a, forked.json()["id"], "notes/a.txt") == b"changed later"
    assert _archives(snapshot_dir) == [f"{snap['id']}.tar.zst"]

    assert api_a.delete(f"/api/v1/snapshots/{snap['id']}").status_code == 204
    assert _archives(snapshot_dir) == []
    assert_error(api_a.get(f"/api/v1/snapshots/{snap['id']}"), 404, "snapshot_not_found")
    # a sandbox started from it goes on without it
    assert _read(api_a, fork["id"], "notes/a.txt") == b"kept"


def test_pause_freezes_and_resume_continues(api_a, sandbox_a, local_sandboxes):  # type: ignore[no-untyped-def]
    sid = sandbox_a["id"]
    assert (
        _post(
            api_a, f"/api/v1/sandboxes/{sid}/commands", {"command": COUNTER, "background": True}
        ).status_code
        == 202
    )

    def count() -> int:
        return _count(local_sandboxes, sid)

    wait_for(lambda: count() > 3)
    paused = _post(api_a, f"/api/v1/sandboxes/{sid}/pause")
    assert paused.status_code == 200, paused.content
    assert paused.json()["state"] == "paused" and paused.json()["paused_at"]
    first = count()
    time.sleep(0.1)  # twenty periods of the counter
    assert count() == first
    assert api_a.get(f"/api/v1/sandboxes/{sid}").json()["state"] == "paused"
    for response in (
        _post(api_a, f"/api/v1/sandboxes/{sid}/commands", {"command": "true"}),
        api_a.get(f"/api/v1/sandboxes/{sid}/files/content?path=/tmp/count"),
        _post(api_a, f"/api/v1/sandboxes/{sid}/timeout", {"timeout_s": 600}),
    ):
        error = assert_error(response, 409, "sandbox_paused")
        assert f"/api/v1/sandboxes/{sid}/resume" in error["message"]
    assert _post(api_a, f"/api/v1/sandboxes/{sid}/pause").json()["state"] == "paused"
    resumed = _post(api_a, f"/api/v1/sandboxes/{sid}/resume")
    assert resumed.status_code == 200 and resumed.json()["state"] == "running"
    assert resumed.json()["paused_at"] is None
    assert resumed.json()["last_activity_at"] >= paused.json()["paused_at"]
    wait_for(lambda: count() > first + 3)
    assert _post(api_a, f"/api/v1/sandboxes/{sid}/resume").json()["state"] == "running"


def test_paused_counts_toward_the_cap_archived_does_not_and_resume_restores(  # type: ignore[no-untyped-def]
    api_a, sandbox_a, settings, local_sandboxes, snapshot_dir
):
    settings.SANDPIT_MAX_CONCURRENT_SANDBOXES = 1
    sid = sandbox_a["id"]
    _write(api_a, sid, "work.txt", b"survives archiving")
    assert (
        _post(
            api_a, f"/api/v1/sandboxes/{sid}/commands", {"command": COUNTER, "background": True}
        ).status_code
        == 202
    )
    # Paused only once the counter wrote its file: the archive must hold it.
    wait_for(lambda: _count(local_sandboxes, sid) > 0)
    assert _post(api_a, f"/api/v1/sandboxes/{sid}/pause").status_code == 200
    assert_error(_post(api_a, "/api/v1/sandboxes"), 429, "sandbox_limit_reached")

    settings.SANDPIT_PAUSED_ARCHIVE_AFTER_S = 3600
    assert reap_sandboxes(sweep_leftovers=False).archived == []  # not paused long enough
    settings.SANDPIT_PAUSED_ARCHIVE_AFTER_S = 0
    report = reap_sandboxes(sweep_leftovers=False)
    assert report.archived == [sid]
    assert api_a.get(f"/api/v1/sandboxes/{sid}").json()["state"] == "archived"
    assert sid not in {h.provider_id for h in local_sandboxes.list_sandboxes()}
    kept = api_a.get(f"/api/v1/sandboxes/{sid}/snapshots").json()["results"]
    assert [s["kind"] for s in kept] == ["archive"]
    assert_error(api_a.delete(f"/api/v1/snapshots/{kept[0]['id']}"), 409, "snapshot_in_use")
    assert_error(
        _post(api_a, f"/api/v1/sandboxes/{sid}/commands", {"command": "true"}),
        409,
        "sandbox_paused",
    )

    other = _post(api_a, "/api/v1/sandboxes")  # the archived one holds no place
    assert other.status_code == 201, other.content
    assert_error(_post(api_a, f"/api/v1/sandboxes/{sid}/resume"), 429, "sandbox_limit_reached")
    assert api_a.delete(f"/api/v1/sandboxes/{other.json()['id']}").status_code == 200

    resumed = _post(api_a, f"/api/v1/sandboxes/{sid}/resume")
    assert resumed.status_code == 200, resumed.content
    assert resumed.json()["state"] == "running"
    assert _read(api_a, sid, "work.txt") == b"survives archiving"
    before = _read(api_a, sid, "/tmp/count")
    time.sleep(0.1)
    assert _read(api_a, sid, "/tmp/count") == before  # files came back, processes did not
    processes = api_a.get(f"/api/v1/sandboxes/{sid}/processes").json()
    assert not [p for p in processes.get("results", processes) if p["running"]]
    assert api_a.get(f"/api/v1/sandboxes/{sid}/snapshots").json()["results"] == []
    assert _archives(snapshot_dir) == []


def test_destroying_an_archived_sandbox_removes_its_archive(  # type: ignore[no-untyped-def]
    api_a, sandbox_a, settings, snapshot_dir
):
    sid = sandbox_a["id"]
    _post(api_a, f"/api/v1/sandboxes/{sid}/pause")
    settings.SANDPIT_PAUSED_ARCHIVE_AFTER_S = 0
    assert reap_sandboxes(sweep_leftovers=False).archived == [sid]
    assert len(_archives(snapshot_dir)) == 1
    assert api_a.delete(f"/api/v1/sandboxes/{sid}").json()["state"] == "destroyed"
    assert _archives(snapshot_dir) == []
    assert not Snapshot.objects.filter(source_sandbox_id=sid).exists()


def test_snapshot_limits_per_organization(api_a, sandbox_a, settings, snapshot_dir):  # type: ignore[no-untyped-def]
    sid = sandbox_a["id"]
    settings.SANDPIT_MAX_SNAPSHOTS_PER_ORG = 1
    first = _post(api_a, f"/api/v1/sandboxes/{sid}/snapshots")
    assert first.status_code == 201
    assert_error(_post(api_a, f"/api/v1/sandboxes/{sid}/snapshots"), 429, "snapshot_limit_reached")
    assert api_a.delete(f"/api/v1/snapshots/{first.json()['id']}").status_code == 204

    settings.SANDPIT_MAX_SNAPSHOTS_PER_ORG = 10
    settings.SANDPIT_MAX_SNAPSHOT_BYTES_PER_ORG = 200_000
    assert (
        _post(
            api_a,
            f"/api/v1/sandboxes/{sid}/commands",
            {"command": "head -c 1000000 /dev/urandom > r"},
        ).status_code
        == 200
    )
    error = assert_error(
        _post(api_a, f"/api/v1/sandboxes/{sid}/snapshots"), 429, "snapshot_storage_full"
    )
    assert "200,000" in error["message"]
    assert_error(_post(api_a, f"/api/v1/sandboxes/{sid}/fork"), 429, "snapshot_storage_full")
    assert _archives(snapshot_dir) == []
    assert not Snapshot.objects.exists()
    assert Sandbox.objects.count() == 1  # the refused fork made no sandbox


def test_other_organizations_ids_are_not_found(api_a, api_b, anon_api, sandbox_a):  # type: ignore[no-untyped-def]
    sid = sandbox_a["id"]
    snap = _post(api_a, f"/api/v1/sandboxes/{sid}/snapshots").json()
    assert_error(api_b.get(f"/api/v1/snapshots/{snap['id']}"), 404, "snapshot_not_found")
    assert_error(api_b.delete(f"/api/v1/snapshots/{snap['id']}"), 404, "snapshot_not_found")
    assert_error(_post(api_b, "/api/v1/sandboxes", {"snapshot": snap["id"]}), 404)
    for action in ("pause", "resume", "fork", "snapshots"):
        assert_error(_post(api_b, f"/api/v1/sandboxes/{sid}/{action}"), 404, "sandbox_not_found")
    assert_error(api_b.get(f"/api/v1/sandboxes/{sid}/snapshots"), 404, "sandbox_not_found")
    assert api_b.get("/api/v1/snapshots").json()["results"] == []
    assert anon_api.get(f"/api/v1/snapshots/{snap['id']}").status_code == 401
    assert anon_api.post(f"/api/v1/sandboxes/{sid}/pause").status_code == 401
    assert api_a.get(f"/api/v1/snapshots/{snap['id']}").status_code == 200  # still there
    assert_error(_post(api_a, f"/api/v1/sandboxes/{sid}/snapshots", {"nme": "x"}), 400)


def test_deleting_the_organization_removes_its_snapshot_files(  # type: ignore[no-untyped-def]
    api_a, sandbox_a, org_a, snapshot_dir
):
    assert _post(api_a, f"/api/v1/sandboxes/{sandbox_a['id']}/snapshots").status_code == 201
    assert len(_archives(snapshot_dir)) == 1
    Organization.objects.filter(pk=org_a.pk).delete()
    assert _archives(snapshot_dir) == []


@pytest.fixture
def docker_api(settings):  # type: ignore[no-untyped-def]
    """local and docker enabled (docker from the test image); docker sandboxes destroyed after."""
    from sandboxes.providers import get_provider, reset_providers
    from tests.docker_support import TEST_INSTALLATION, docker_provider_or_skip

    docker_provider_or_skip()
    settings.SANDPIT_PROVIDERS = ["local", "docker"]
    settings.SANDPIT_DEFAULT_PROVIDER = "local"
    settings.SANDPIT_INSTALLATION = TEST_INSTALLATION
    settings.SANDPIT_DOCKER_POOL_SIZE = 0
    reset_providers()
    yield
    provider = get_provider("docker")
    for handle in provider.list_sandboxes():
        if handle.labels.get("sandpit.org"):
            provider.destroy(handle.provider_id)
    reset_providers()


@pytest.mark.docker
def test_docker_fork_archive_and_resume(api_a, docker_api, settings, snapshot_dir):  # type: ignore[no-untyped-def]
    created = _post(api_a, "/api/v1/sandboxes", {"provider": "docker"})
    assert created.status_code == 201, created.content
    sid = created.json()["id"]
    _write(api_a, sid, "work.txt", b"on docker")
    forked = _post(api_a, f"/api/v1/sandboxes/{sid}/fork")
    assert forked.status_code == 201, forked.content
    assert forked.json()["provider"] == "docker"
    assert _read(api_a, forked.json()["id"], "work.txt") == b"on docker"

    assert _post(api_a, f"/api/v1/sandboxes/{sid}/pause").json()["state"] == "paused"
    settings.SANDPIT_PAUSED_ARCHIVE_AFTER_S = 0
    assert reap_sandboxes(sweep_leftovers=False).archived == [sid]
    assert api_a.get(f"/api/v1/sandboxes/{sid}").json()["state"] == "archived"
    resumed = _post(api_a, f"/api/v1/sandboxes/{sid}/resume")
    assert resumed.status_code == 200, resumed.content
    assert resumed.json()["state"] == "running"
    assert _read(api_a, sid, "work.txt") == b"on docker"
    assert _archives(snapshot_dir) == []


def test_a_snapshot_being_taken_cannot_be_deleted_or_started_from(api_a, org_a, sandbox_a):  # type: ignore[no-untyped-def]
    taking = Snapshot.objects.create(
        organization=org_a,
        source_sandbox_id=sandbox_a["id"],
        provider="local",
        state="creating",
    )
    assert_error(api_a.delete(f"/api/v1/snapshots/{taking.id}"), 409, "snapshot_not_ready")
    assert_error(
        _post(api_a, "/api/v1/sandboxes", {"snapshot": taking.id}), 409, "snapshot_not_ready"
    )
    assert Snapshot.objects.filter(pk=taking.pk).exists()


def test_the_reaper_removes_snapshots_whose_taker_died(org_a, settings, snapshot_dir):  # type: ignore[no-untyped-def]
    from datetime import timedelta

    from django.utils import timezone

    from sandboxes.snapshot_store import snapshot_path

    old = timezone.now() - timedelta(seconds=settings.SANDPIT_CREATE_STALE_S + 1)
    stale = Snapshot.objects.create(
        organization=org_a, source_sandbox_id="sbx_x", provider="local", state="creating"
    )
    partial = snapshot_path(org_a.pk, stale.id)
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"half an archive")
    Snapshot.objects.filter(pk=stale.pk).update(created_at=old, location=str(partial))
    fresh = Snapshot.objects.create(
        organization=org_a, source_sandbox_id="sbx_y", provider="local", state="creating"
    )
    reap_sandboxes(sweep_leftovers=False)
    assert list(Snapshot.objects.values_list("id", flat=True)) == [fresh.id]
    assert not partial.exists()


def test_staff_see_paused_sandboxes_as_active(api_a, sandbox_a):  # type: ignore[no-untyped-def]
    from playground.selectors import staff_live_sandboxes, staff_provider_statuses

    _post(api_a, f"/api/v1/sandboxes/{sandbox_a['id']}/pause")
    assert [s.id for s in staff_live_sandboxes()] == [sandbox_a["id"]]
    assert {p.name: p.live_sandboxes for p in staff_provider_statuses()}["local"] == 1


@pytest.mark.django_db
def test_dropping_archives_keeps_manual_snapshots_and_others_sandboxes(org_a):  # type: ignore[no-untyped-def]
    def sandbox() -> Sandbox:
        return Sandbox.objects.create(
            organization=org_a, provider="local", timeout_s=60, expires_at=timezone.now()
        )

    def snapshot(of: Sandbox, kind: str) -> Snapshot:
        return Snapshot.objects.create(
            organization=org_a, sandbox=of, source_sandbox_id=of.pk, provider="local", kind=kind
        )

    mine, other, never_archived = sandbox(), sandbox(), sandbox()
    kept = [snapshot(mine, MANUAL), snapshot(other, ARCHIVE)]
    snapshot(mine, ARCHIVE)
    snapshot(mine, ARCHIVE)
    with CaptureQueriesContext(connection) as queries:
        assert archives_drop(never_archived) == 0
    assert len(queries) == 1  # one lookup answers the usual case
    assert archives_drop(mine) == 2
    assert set(Snapshot.objects.values_list("pk", flat=True)) == {s.pk for s in kept}
