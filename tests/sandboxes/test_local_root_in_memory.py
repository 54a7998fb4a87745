"""A new jail root held in memory (volume.root_in_memory): mounted once, only when empty, and
the jails under it work as on a disk.

Real mounts, real bubblewrap; every root these tests mount is detached again at the end.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.test import override_settings

from sandboxes.providers import get_provider, reset_providers
from sandboxes.providers.base import ExecRequest, SandboxSpec
from sandboxes.providers.local import LocalProvider, volume
from tests.requirements import jail_root, missing_part

REPO = Path(__file__).resolve().parents[2]


def mounts_at(path: Path) -> list[tuple[str, str, str]]:
    """(file system type, source, super options) of every mount at `path`, oldest first."""
    found = []
    with open("/proc/self/mountinfo") as table:
        for line in table:
            fields = line.split()
            if fields[4] != os.fspath(path):
                continue
            after = fields[fields.index("-") + 1 :]
            found.append((after[0], after[1], after[2]))
    return found


@pytest.fixture
def root(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A new, empty jail root; every tmpfs stacked on it detached afterwards."""
    if os.geteuid() != 0:
        missing_part("mounting a jail root needs Sandpit to run as root")
    path = jail_root(request.node.name[:40])
    yield path
    while volume.release_root(path):
        pass
    assert mounts_at(path) == []


def test_a_new_root_is_held_in_memory_and_its_jails_work(root: Path) -> None:
    provider = LocalProvider(root_dir=root, root_in_memory=True, warm_pool=1)
    try:
        assert provider.root_in_memory
        assert volume.on_tmpfs(root)
        ((fstype, source, options),) = mounts_at(root)
        assert (fstype, source) == ("tmpfs", volume.ROOT_SOURCE)
        assert f"size={volume.ROOT_SIZE_MB * 1024}k" in options
        # Passable, not listable, by the jails' uids; no device or set-uid file counts there.
        assert os.stat(root).st_mode & 0o777 == 0o711
        assert {"nosuid", "nodev"} <= set(_mount_options(root))

        # A cold start, then one from the warm pool (its directory renamed on the tmpfs).
        cold = provider.create(SandboxSpec(sandbox_id=f"cold-{uuid.uuid4().hex[:8]}"))
        assert provider._pool is not None and provider._pool.wait_full(30)
        warm = provider.create(SandboxSpec(sandbox_id=f"warm-{uuid.uuid4().hex[:8]}"))
        for handle in (cold, warm):
            sandbox_dir = root / handle.provider_id
            assert volume.on_tmpfs(sandbox_dir)
            # Its files are on its own volume, not on the root's tmpfs.
            workspace = sandbox_dir / "workspace"
            assert os.stat(workspace).st_dev != os.stat(sandbox_dir).st_dev
            result = provider.exec(
                handle.provider_id, ExecRequest(command="echo hi > f && cat f && id -u")
            )
            assert (result.exit_code, result.stdout) == (0, b"hi\n1000\n"), result.stderr
            assert (workspace / "f").read_bytes() == b"hi\n"
        for handle in (cold, warm):
            assert provider.destroy(handle.provider_id)
            assert not (root / handle.provider_id).exists()
    finally:
        provider.close()


def _mount_options(path: Path) -> list[str]:
    with open("/proc/self/mountinfo") as table:
        for line in table:
            fields = line.split()
            if fields[4] == os.fspath(path):
                return fields[5].split(",")
    raise AssertionError(f"nothing mounted at {path}")


def test_a_root_holding_anything_stays_on_disk(root: Path) -> None:
    """Files there may be another process's jails: mounting over them would hide them."""
    (root / "sbx_left_by_another_process").mkdir()
    provider = LocalProvider(root_dir=root, root_in_memory=True)
    try:
        assert not provider.root_in_memory
        assert mounts_at(root) == []
        assert (root / "sbx_left_by_another_process").is_dir()
    finally:
        provider.close()


def test_off_unless_asked(root: Path) -> None:
    provider = LocalProvider(root_dir=root)
    try:
        assert not provider.root_in_memory
        assert mounts_at(root) == []
    finally:
        provider.close()


def test_a_root_already_in_memory_is_not_mounted_again(root: Path) -> None:
    assert volume.root_in_memory(root)
    (root / "kept").write_text("x")
    assert volume.root_in_memory(root)
    assert len(mounts_at(root)) == 1
    assert (root / "kept").read_text() == "x"


_RACE = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from sandboxes.providers.local import volume
start = float(sys.argv[3])
while time.time() < start:
    pass
print(volume.root_in_memory(Path(sys.argv[2])))
"""


def test_processes_starting_at_once_mount_it_once(root: Path) -> None:
    """Web processes start together: each finds the root empty, one mounts it."""
    start = f"{time.time() + 1.0}"
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", _RACE, str(REPO), str(root), start],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(8)
    ]
    answers = [process.communicate(timeout=30) for process in processes]
    assert [out for out, _ in answers] == [b"True\n"] * 8, answers
    assert len(mounts_at(root)) == 1


def test_a_process_that_may_not_mount_leaves_the_root_on_disk(root: Path) -> None:
    """Not root (or without CAP_SYS_ADMIN): nothing is mounted, and the answer says so. The
    module alone (standard library only) runs under the system's python3: the checkout and
    its virtual environment may sit where that user cannot pass."""
    os.chown(root, 65534, 65534)
    probe = Path(volume.__file__).read_text() + f"\nprint(root_in_memory(Path({str(root)!r})))\n"
    done = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        + ["/usr/bin/python3", "-I", "-c", probe],
        capture_output=True,
        timeout=30,
        cwd="/",
    )
    assert done.stdout == b"False\n", done.stderr
    assert mounts_at(root) == []


def test_the_product_holds_a_new_root_in_memory_by_default(root: Path) -> None:
    """settings.SANDPIT_LOCAL_ROOT_IN_MEMORY (on unless the environment says false) reaches
    the provider the product builds. The suite turns it off (scripts/test.sh): its roots
    come and go with each test."""
    assert isinstance(settings.SANDPIT_LOCAL_ROOT_IN_MEMORY, bool)
    with override_settings(
        SANDPIT_PROVIDERS=["local"],
        SANDPIT_LOCAL_ROOT=root,
        SANDPIT_LOCAL_ROOT_IN_MEMORY=True,
        SANDPIT_LOCAL_WARM_POOL=0,
    ):
        reset_providers()
        try:
            provider = get_provider("local")
            assert isinstance(provider, LocalProvider)
            assert provider.root_in_memory
            assert mounts_at(root)[0][1] == volume.ROOT_SOURCE
        finally:
            reset_providers()
    default = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from django.conf import settings; "
            "print(settings.SANDPIT_LOCAL_ROOT_IN_MEMORY)",
        ],
        cwd=REPO,
        env={
            **{k: v for k, v in os.environ.items() if k != "SANDPIT_LOCAL_ROOT_IN_MEMORY"},
            "DJANGO_SETTINGS_MODULE": "playground.settings",
        },
        capture_output=True,
        timeout=60,
    )
    assert default.stdout.strip() == b"True", default.stderr
