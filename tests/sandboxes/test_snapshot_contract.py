"""Pause, resume and snapshots behave alike on local and docker (the provider contract).

A counter process proves the freeze: while paused, two reads of its file some time apart
agree; after resume it moves again. Snapshots are restored into new sandboxes and checked
as the new sandbox sees them: contents, ownership, no setuid bit, links kept as links (never
followed on the host), and a snapshot of a sandbox whose disk is full."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxes.providers.base import (
    ExecRequest,
    FileNotFound,
    Resources,
    SandboxSpec,
    SnapshotProvider,
)
from tests.sandboxes.test_provider_contract import wait_for

COUNTER = "i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.005; done"


@pytest.fixture(
    params=["local", pytest.param("docker", marks=pytest.mark.docker)],
)
def snap_provider(request) -> SnapshotProvider:  # type: ignore[no-untyped-def]
    return request.getfixturevalue(f"{request.param}_provider")


@pytest.fixture
def made(snap_provider) -> Iterator[list[str]]:  # type: ignore[no-untyped-def]
    """Provider ids to destroy after the test."""
    ids: list[str] = []
    yield ids
    for provider_id in ids:
        snap_provider.destroy(provider_id)


def _create(provider: SnapshotProvider, made: list[str], **spec: object) -> str:
    handle = provider.create(SandboxSpec(sandbox_id="t" + uuid.uuid4().hex[:12], **spec))  # type: ignore[arg-type]
    made.append(handle.provider_id)
    return handle.provider_id


def _sh(provider: SnapshotProvider, sandbox: str, command: str) -> str:
    result = provider.exec(sandbox, ExecRequest(command=command, timeout_s=60))
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result.stdout.decode()


def _count(provider: SnapshotProvider, sandbox: str) -> int:
    try:
        text = provider.read_file(sandbox, "/tmp/count").decode().strip()
    except FileNotFound:  # the counter has not started yet
        return 0
    return int(text) if text else 0


def _count_from_host(provider: SnapshotProvider, sandbox: str) -> int:
    """The counter read without any process of the sandbox (a paused docker sandbox's agent
    is frozen too): local files live on the host; a container's through its init's root."""
    if provider.name == "local":
        return _count(provider, sandbox)
    pid = subprocess.run(
        ["docker", "inspect", "--format", "{{.State.Pid}}", sandbox],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    text = Path(f"/proc/{pid}/root/tmp/count").read_text().strip()
    return int(text) if text else 0


def _frozen(provider: SnapshotProvider, sandbox: str) -> int:
    """The counter, read twice a few of its periods apart: equal while frozen."""
    first = _count_from_host(provider, sandbox)
    time.sleep(0.1)  # twenty of the counter's periods
    assert _count_from_host(provider, sandbox) == first
    return first


def test_pause_freezes_processes_and_resume_continues(snap_provider, made, tmp_path):  # type: ignore[no-untyped-def]
    sandbox = _create(snap_provider, made)
    snap_provider.start_process(sandbox, "sh", ["-c", COUNTER])
    wait_for(lambda: _count(snap_provider, sandbox) > 3)
    snap_provider.pause(sandbox)
    snap_provider.pause(sandbox)  # idempotent
    _frozen(snap_provider, sandbox)
    # A paused sandbox can be snapshotted and stays paused (docker thaws it for the copy).
    snap_provider.snapshot(sandbox, str(tmp_path / "while-paused.tar.zst"), 10**9)
    first = _frozen(snap_provider, sandbox)
    assert snap_provider.get(sandbox).state.value == "running"  # alive, not vanished
    snap_provider.resume(sandbox)
    wait_for(lambda: _count(snap_provider, sandbox) > first + 3)
    snap_provider.resume(sandbox)  # idempotent


def test_destroying_a_paused_sandbox_ends_it(snap_provider, made):  # type: ignore[no-untyped-def]
    sandbox = _create(snap_provider, made)
    snap_provider.start_process(sandbox, "sleep", ["300"])
    snap_provider.pause(sandbox)
    assert snap_provider.destroy(sandbox) is True
    assert sandbox not in {h.provider_id for h in snap_provider.list_sandboxes()}


def test_snapshot_restores_files_owned_by_the_new_sandbox(snap_provider, made, tmp_path):  # type: ignore[no-untyped-def]
    source = _create(snap_provider, made)
    _sh(
        snap_provider,
        source,
        "mkdir -p src/deep && echo hello > src/deep/a.txt && printf x > /tmp/scratch "
        "&& cp /bin/true su && chmod 4755 su && chmod 2755 src && "
        "ln -s /etc/shadow leak && ln -s ../../../../../../etc dotdot && "
        "mkdir -p /tmp/.sandpit/processes && echo old > /tmp/.sandpit/processes/1.out",
    )
    archive = snap_provider.snapshot(source, str(tmp_path / "s.tar.zst"), 10**9)
    assert archive.size_bytes == os.path.getsize(archive.location) > 0
    fork = _create(snap_provider, made, restore_from=archive.location)
    listing = _sh(
        snap_provider,
        fork,
        "cat src/deep/a.txt /tmp/scratch; echo; stat -c '%n %u %a' su src src/deep/a.txt; "
        "readlink leak dotdot; ls -a /tmp/.sandpit/processes 2>&1 | grep -c 1.out; true",
    )
    assert listing.splitlines() == [
        "hello",
        "x",
        "su 1000 755",  # no setuid bit
        "src 1000 755",  # no setgid bit
        "src/deep/a.txt 1000 644",
        "/etc/shadow",  # links stay links
        "../../../../../../etc",
        "0",  # background logs of processes that do not come back are left out
    ]
    # The sandbox reads what a link points to inside itself, never the host's file.
    shadow = snap_provider.exec(fork, ExecRequest(command="cat leak"))
    assert shadow.exit_code != 0
    # The source is untouched and still running.
    assert _sh(snap_provider, source, "cat src/deep/a.txt") == "hello\n"


def test_snapshot_of_a_full_disk_restores(snap_provider, made, tmp_path):  # type: ignore[no-untyped-def]
    small = Resources(disk_mb=8)
    source = _create(snap_provider, made, resources=small)
    fill = snap_provider.exec(
        source, ExecRequest(command="head -c 20000000 /dev/urandom > big; echo done", timeout_s=60)
    )
    assert fill.stdout.strip() == b"done"  # the write failed part-way: the disk is full
    size = int(_sh(snap_provider, source, "stat -c %s big"))
    assert 1_000_000 < size < 20_000_000
    archive = snap_provider.snapshot(source, str(tmp_path / "full.tar.zst"), 10**9)
    fork = _create(snap_provider, made, resources=small, restore_from=archive.location)
    assert int(_sh(snap_provider, fork, "stat -c %s big")) == size


def test_snapshot_over_the_byte_budget_leaves_nothing(snap_provider, made, tmp_path):  # type: ignore[no-untyped-def]
    source = _create(snap_provider, made)
    _sh(snap_provider, source, "head -c 3000000 /dev/urandom > noise")
    target = tmp_path / "over.tar.zst"
    from sandboxes.providers.base import ResourceExhausted

    with pytest.raises(ResourceExhausted):
        snap_provider.snapshot(source, str(target), 1_000_000)
    assert not target.exists()
    assert not Path(target).parent.joinpath("over.tar.zst").exists()


def test_sparse_files_stay_sparse_and_a_too_small_disk_is_refused(snap_provider, made, tmp_path):  # type: ignore[no-untyped-def]
    from sandboxes.providers.base import ResourceExhausted

    source = _create(snap_provider, made)
    # A hole as large as the disk allows, and 3 MB of data.
    _sh(snap_provider, source, "truncate -s 400M hole && head -c 3000000 /dev/urandom > data")
    archive = snap_provider.snapshot(source, str(tmp_path / "sparse.tar.zst"), 10**9)
    assert archive.content_bytes < 20_000_000  # the hole was not read as zeros
    fork = _create(snap_provider, made, restore_from=archive.location)
    assert _sh(snap_provider, fork, "stat -c %s hole; du -k hole | cut -f1").split() == [
        str(400 * 1024 * 1024),
        "0",
    ]
    with pytest.raises(ResourceExhausted, match="disk_mb"):
        _create(snap_provider, made, resources=Resources(disk_mb=2), restore_from=archive.location)
