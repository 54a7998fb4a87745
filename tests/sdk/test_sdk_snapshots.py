"""Snapshots, fork, pause and resume through the SDK and the CLI, on local and docker."""

from __future__ import annotations

import pytest
from sandpit import SandpitError

from .conftest import cli_env
from .test_cli import sandpit

pytestmark = pytest.mark.django_db(transaction=True)


def test_snapshot_fork_pause_resume(client, sbx):  # type: ignore[no-untyped-def]
    sbx.files.write("notes/a.txt", b"kept")
    snapshot = sbx.snapshot("before")
    assert snapshot.state == "ready" and snapshot.sandbox == sbx.id and snapshot.size_bytes > 0
    assert [s.id for s in sbx.snapshots()] == [snapshot.id]
    assert snapshot.id in {s.id for s in client.snapshots()}
    started = client.create(snapshot=snapshot.id)
    fork = sbx.fork()
    try:
        assert started.info().snapshot == snapshot.id
        assert started.files.read("notes/a.txt") == b"kept"
        assert fork.files.read("notes/a.txt") == b"kept"
        assert fork.info().metadata["forked_from"] == sbx.id
    finally:
        started.kill()
        fork.kill()

    paused = sbx.pause()
    assert paused.state == "paused" and paused.paused_at is not None
    with pytest.raises(SandpitError) as refused:
        sbx.commands.run("true")
    assert refused.value.code == "sandbox_paused"
    assert sbx.resume().state == "running"
    assert sbx.commands.run("cat notes/a.txt").stdout == "kept"
    assert client.delete_snapshot(snapshot.id) is True
    assert client.delete_snapshot(snapshot.id) is False


def test_cli_pause_resume_snapshot_fork(sdk_env, local_sbx):  # type: ignore[no-untyped-def]
    env = cli_env(sdk_env)
    paused = sandpit(env, "sandbox", "pause", local_sbx.id)
    assert paused.returncode == 0 and paused.stdout.strip() == f"{local_sbx.id} paused"
    snap = sandpit(env, "sandbox", "snapshot", local_sbx.id, "--name", "cli")
    assert snap.returncode == 0 and snap.stdout.strip().startswith("snp_")
    resumed = sandpit(env, "sandbox", "resume", local_sbx.id)
    assert resumed.stdout.strip() == f"{local_sbx.id} running"
    forked = sandpit(env, "sandbox", "fork", local_sbx.id)
    assert forked.returncode == 0 and forked.stdout.strip().startswith("sbx_")
    started = sandpit(env, "sandbox", "create", "--snapshot", snap.stdout.strip())
    assert started.returncode == 0, started.stderr
    for sandbox_id in (forked.stdout.strip(), started.stdout.strip()):
        assert sandpit(env, "sandbox", "kill", sandbox_id).returncode == 0
