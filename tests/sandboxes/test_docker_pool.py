"""The docker provider's warm pool (sandboxes/providers/docker/pool.py) on a real engine:
a create claims a started container and the pool refills; a claimed sandbox is what a
cold one would be (clean, its own name, labels and age); one container serves one sandbox
only, also when creates race; the pool can be off; a dead server's pool is reaped."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sandboxes.providers.base import (
    ExecRequest,
    InvalidRequest,
    Resources,
    SandboxGone,
    SandboxSpec,
)
from sandboxes.providers.docker import DockerProvider
from sandboxes.providers.docker.pool import POOL_ID_PREFIX
from tests.docker_support import TEST_INSTALLATION, docker_provider_or_skip

REPO = Path(__file__).resolve().parents[2]
FILL_S = 60


@pytest.fixture(scope="module")
def pooled() -> Iterator[DockerProvider]:
    image = docker_provider_or_skip().image
    provider = DockerProvider(
        image=image, installation=TEST_INSTALLATION, pool_size=2, create_concurrency=2
    )
    yield provider
    provider.close()


@pytest.fixture
def made(pooled: DockerProvider) -> Iterator[list[str]]:
    """Provider ids to destroy after the test."""
    ids: list[str] = []
    yield ids
    for provider_id in ids:
        pooled.destroy(provider_id)


def new_id() -> str:
    return "t" + uuid.uuid4().hex[:16]


def inspect(container_id: str) -> dict:  # type: ignore[type-arg]
    out = subprocess.run(
        ["docker", "inspect", container_id], capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out)[0]  # type: ignore[no-any-return]


def sh(provider: DockerProvider, provider_id: str, command: str) -> str:
    result = provider.exec(provider_id, ExecRequest(command=command, timeout_s=30))
    assert result.exit_code == 0, result
    return result.stdout.decode()


def full_pool(provider: DockerProvider) -> list[str]:
    assert provider.pool is not None
    assert provider.pool.wait_full(FILL_S), "the pool did not fill"
    return provider.pool.idle_ids()


def test_create_claims_a_pooled_container_and_the_pool_refills(pooled, made):
    idle = full_pool(pooled)
    sandbox_id = new_id()
    before = datetime.now(UTC)
    handle = pooled.create(SandboxSpec(sandbox_id=sandbox_id, labels={"sandpit.org": "42"}))
    made.append(handle.provider_id)
    assert handle.provider_id == idle[0]  # claimed, not started
    assert handle.labels["sandpit.org"] == "42"
    refilled = full_pool(pooled)
    assert handle.provider_id not in refilled and len(set(refilled) - set(idle)) == 1

    # Named, labelled and aged as the sandbox it became, through every read.
    assert inspect(handle.provider_id)["Name"] == f"/sandpit-{TEST_INSTALLATION}-{sandbox_id}"
    got = pooled.get(handle.provider_id)
    assert got.labels["sandpit.sandbox_id"] == sandbox_id
    assert got.labels["sandpit.org"] == "42"
    assert "sandpit.pool" not in got.labels
    assert got.created_at >= before
    listed = {h.provider_id: h for h in pooled.list_sandboxes()}
    assert listed[handle.provider_id].labels["sandpit.org"] == "42"
    assert listed[handle.provider_id].created_at == got.created_at
    # The pool's own containers are no sandboxes while their server runs.
    assert not set(refilled) & set(listed)
    with pytest.raises(SandboxGone):
        pooled.get(refilled[0])
    assert pooled.stats(handle.provider_id).uptime_s <= (datetime.now(UTC) - before).total_seconds()


def test_a_claimed_sandbox_is_clean_and_like_a_cold_one(pooled, made):
    full_pool(pooled)
    warm = pooled.create(SandboxSpec(sandbox_id=new_id()))
    made.append(warm.provider_id)
    with pooled._gate.cold():
        cold = pooled._start_new(SandboxSpec(sandbox_id=new_id()))
    made.append(cold.provider_id)
    probe = (
        "hostname; id; pwd; echo HOME=$HOME; ls -A /workspace /tmp; ulimit -n -f -t -c;"
        " cat /proc/1/cmdline | tr '\\0' ' '; echo;"
        # ps before sort starts: in `ps | sort`, ps lists sort only if it started first.
        ' p=$(ps -eo user,args --no-headers); echo "$p" | sort'
    )
    warm_out = sh(pooled, warm.provider_id, probe)
    assert warm_out == sh(pooled, cold.provider_id, probe)
    assert sh(pooled, warm.provider_id, "find /workspace /tmp -mindepth 1 | wc -l") == "0\n"
    assert pooled.list_processes(warm.provider_id) == []
    warm_info, cold_info = inspect(warm.provider_id), inspect(cold.provider_id)
    for key in ("Memory", "NanoCpus", "PidsLimit", "ReadonlyRootfs", "CapDrop", "NetworkMode"):
        assert warm_info["HostConfig"][key] == cold_info["HostConfig"][key], key
    assert warm_info["HostConfig"]["Tmpfs"] == cold_info["HostConfig"]["Tmpfs"]
    assert warm_info["Config"]["Env"] == cold_info["Config"]["Env"]


def test_a_claimed_container_serves_one_sandbox_only(pooled, made):
    full_pool(pooled)
    # A taken sandbox id is refused, and the container it would have used stays pooled.
    first = pooled.create(SandboxSpec(sandbox_id=(sandbox_id := new_id())))
    made.append(first.provider_id)
    full_pool(pooled)
    with pytest.raises(InvalidRequest):
        pooled.create(SandboxSpec(sandbox_id=sandbox_id))
    assert pooled.pool is not None and pooled.pool.idle_count() == 2
    # Destroyed means gone, not back in the pool.
    pooled.destroy(first.provider_id)
    assert first.provider_id not in pooled.pool.idle_ids()
    with pytest.raises(SandboxGone):
        pooled.get(first.provider_id)


def test_racing_creates_never_share_a_container(pooled, made):
    full_pool(pooled)
    ids = [new_id() for _ in range(8)]

    def create(sandbox_id: str) -> str:
        handle = pooled.create(SandboxSpec(sandbox_id=sandbox_id))
        made.append(handle.provider_id)
        pooled.write_file(handle.provider_id, "mine", sandbox_id.encode())
        return handle.provider_id

    with ThreadPoolExecutor(len(ids)) as pool:
        provider_ids = list(pool.map(create, ids))
    assert len(set(provider_ids)) == len(ids)
    for sandbox_id, provider_id in zip(ids, provider_ids, strict=True):
        assert pooled.read_file(provider_id, "mine") == sandbox_id.encode()
        assert sh(pooled, provider_id, "ls -A /workspace") == "mine\n"
        assert pooled.get(provider_id).labels["sandpit.sandbox_id"] == sandbox_id


def test_specs_the_pool_does_not_hold_start_cold(pooled, made):
    idle = full_pool(pooled)
    for spec in (
        SandboxSpec(sandbox_id=new_id(), env={"A": "1"}),
        SandboxSpec(sandbox_id=new_id(), resources=Resources(memory_mb=256)),
    ):
        handle = pooled.create(spec)
        made.append(handle.provider_id)
        assert handle.provider_id not in idle
    assert sorted(pooled.pool.idle_ids()) == sorted(idle)  # type: ignore[union-attr]
    assert sh(pooled, made[0], "echo $A") == "1\n"


def test_pool_off_starts_every_sandbox_cold():
    image = docker_provider_or_skip().image
    provider = DockerProvider(image=image, installation=TEST_INSTALLATION, pool_size=0)
    assert provider.pool is None
    handle = provider.create(SandboxSpec(sandbox_id=(sandbox_id := new_id())))
    try:
        labels = inspect(handle.provider_id)["Config"]["Labels"]
        assert labels["sandpit.sandbox_id"] == sandbox_id and "sandpit.pool" not in labels
        assert sh(provider, handle.provider_id, "node -v").startswith("v")
    finally:
        provider.destroy(handle.provider_id)


DEAD_SERVER = """
import json, os, sys
from sandboxes.providers.docker import DockerProvider
provider = DockerProvider(image=sys.argv[1], installation=sys.argv[2], pool_size=2)
assert provider.pool.wait_full(60)
print(json.dumps(provider.pool.idle_ids()), flush=True)
sys.stdin.readline()
os.kill(os.getpid(), 9)  # a crash: no exit handlers run
"""


@pytest.mark.django_db(transaction=True)
def test_a_dead_servers_pool_containers_are_reaped(settings):
    from django.utils import timezone

    from sandboxes.operations import orphan_grace_s, reconcile_orphans
    from sandboxes.providers import reset_providers

    image = docker_provider_or_skip().image
    installation = "pytest-pool-" + uuid.uuid4().hex[:8]  # the reconciler sweeps it all
    server = subprocess.Popen(
        [sys.executable, "-c", DEAD_SERVER, image, installation],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None and server.stdin is not None
    left = json.loads(server.stdout.readline())
    viewer = DockerProvider(image=image, installation=installation)
    try:
        assert len(left) == 2
        assert not set(left) & {h.provider_id for h in viewer.list_sandboxes()}  # owner alive
        server.stdin.write("\n")
        server.stdin.flush()
        assert server.wait(30) == -9
        listed = {h.provider_id: h for h in viewer.list_sandboxes()}
        assert set(left) <= set(listed)  # now orphans ...
        assert all(listed[c].labels["sandpit.sandbox_id"].startswith(POOL_ID_PREFIX) for c in left)

        settings.SANDPIT_PROVIDERS = ["docker"]
        settings.SANDPIT_INSTALLATION = installation
        settings.SANDPIT_DOCKER_IMAGE = image
        settings.SANDPIT_DOCKER_POOL_SIZE = 0
        reset_providers()
        later = timezone.now() + timedelta(seconds=orphan_grace_s() + 5)
        report = reconcile_orphans(now=later)  # ... which the reconciler removes
        assert set(left) <= set(report.orphans_destroyed)
        for cid in left:
            with pytest.raises(SandboxGone):
                viewer.get(cid)
    finally:
        server.kill()
        for cid in left:
            viewer.destroy(cid)
        reset_providers()


def test_a_new_pool_removes_a_dead_pools_containers_on_this_host():
    """Also another installation's: nothing reconciles a test server's installation."""
    image = docker_provider_or_skip().image
    installation = "pytest-pool-" + uuid.uuid4().hex[:8]
    server = subprocess.run(
        [sys.executable, "-c", DEAD_SERVER, image, installation],
        cwd=REPO,
        input="\n",
        capture_output=True,
        text=True,
        timeout=90,
    )
    left = json.loads(server.stdout.splitlines()[0])
    assert len(left) == 2
    # Any installation's new pool: those containers were never sandboxes of anyone.
    fresh = DockerProvider(image=image, installation=installation + "-next", pool_size=1)
    try:
        assert fresh.pool is not None and fresh.pool.wait_full(FILL_S)
        for cid in left:
            with pytest.raises(SandboxGone):
                fresh._inspect(cid)
    finally:
        fresh.close()
        leftover = DockerProvider(image=image, installation=installation)
        for cid in left:
            leftover.destroy(cid)


def test_settings_size_the_pool_and_reset_closes_it(settings):
    from sandboxes.providers import get_provider, reset_providers

    image = docker_provider_or_skip().image
    settings.SANDPIT_PROVIDERS = ["docker"]
    settings.SANDPIT_INSTALLATION = "pytest-pool-" + uuid.uuid4().hex[:8]
    settings.SANDPIT_DOCKER_IMAGE = image
    settings.SANDPIT_DOCKER_POOL_SIZE = 1
    settings.SANDPIT_DOCKER_POOL_MAX = 5
    settings.SANDPIT_DOCKER_CREATE_CONCURRENCY = 2
    reset_providers()
    try:
        built = get_provider("docker")  # DockerEngines over one engine, or the provider
        provider = next(iter(getattr(built, "providers", {"": built}).values()))
        assert isinstance(provider, DockerProvider) and provider.pool is not None
        pool = provider.pool
        assert pool.size == 1 and pool.max_size == 5 and provider._gate.limit == 2
        assert pool.wait_full(FILL_S)
        (idle,) = pool.idle_ids()
        reset_providers()  # closes it: the idle container goes
        with pytest.raises(SandboxGone):
            DockerProvider(image=image, installation=settings.SANDPIT_INSTALLATION)._inspect(idle)
        settings.SANDPIT_DOCKER_POOL_SIZE = 0
        reset_providers()
        assert get_provider("docker").pool is None  # type: ignore[attr-defined]
    finally:
        reset_providers()


def test_engine_placement_does_not_count_idle_pool_containers():
    from sandboxes.providers.docker.engines import DockerEngines, parse_engines

    image = docker_provider_or_skip().image
    installation = "pytest-pool-" + uuid.uuid4().hex[:8]
    engines = DockerEngines(
        parse_engines("", "unix:///var/run/docker.sock"),
        image=image,
        installation=installation,
        pool_size=2,
    )
    provider = engines.providers[engines.first]
    try:
        handle = engines.create(SandboxSpec(sandbox_id=new_id()))
        assert provider.pool is not None and provider.pool.wait_full(FILL_S)
        (status,) = engines.engine_statuses()
        assert status.sandboxes == 1  # the claimed one (or a cold one), not the 2 idle
        assert status.memory_reserved_mb == Resources().memory_mb
        engines.destroy(handle.provider_id)
        (status,) = engines.engine_statuses()
        assert status.sandboxes == 0
    finally:
        engines.close()


EXITING_SERVER = """
import json, sys
from sandboxes.providers.docker import DockerProvider
provider = DockerProvider(image=sys.argv[1], installation=sys.argv[2], pool_size=2)
assert provider.pool.wait_full(60)
print(json.dumps(provider.pool.idle_ids()), flush=True)
"""


def test_a_server_that_exits_removes_its_pool():
    image = docker_provider_or_skip().image
    installation = "pytest-pool-" + uuid.uuid4().hex[:8]
    server = subprocess.run(
        [sys.executable, "-c", EXITING_SERVER, image, installation],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=90,
    )
    left = json.loads(server.stdout.splitlines()[0])
    viewer = DockerProvider(image=image, installation=installation)
    try:
        assert server.returncode == 0 and len(left) == 2
        for cid in left:
            with pytest.raises(SandboxGone):
                viewer._inspect(cid)
    finally:
        for cid in left:
            viewer.destroy(cid)


def test_a_burst_grows_the_pool_then_it_shrinks_back(monkeypatch):  # type: ignore[no-untyped-def]
    """Creates that found the pool empty raise its target (at most its max); it refills
    towards it once they are done, and removes the surplus after a quiet spell."""
    from sandboxes.providers import burst_sizing

    image = docker_provider_or_skip().image
    provider = DockerProvider(
        image=image,
        installation=TEST_INSTALLATION,
        pool_size=1,
        pool_max=3,
        create_concurrency=2,
    )
    made: list[str] = []
    try:
        pool = provider.pool
        assert pool is not None
        made.append(provider.create(SandboxSpec(sandbox_id=new_id())).provider_id)
        assert pool.target() == 1  # the first create fills it: no miss
        assert pool.wait_full(FILL_S)
        with ThreadPoolExecutor(4) as burst:  # one claims the idle container, three go cold
            specs = [SandboxSpec(sandbox_id=new_id()) for _ in range(4)]
            made.extend(handle.provider_id for handle in burst.map(provider.create, specs))
        assert pool.target() == 3  # 1 + 3 misses, at most pool_max
        assert pool.wait_full(FILL_S)
        idle = pool.idle_ids()
        assert len(idle) == 3
        # Quiet long enough: back to the floor, the surplus removed from the engine.
        monkeypatch.setattr(burst_sizing, "DECAY_S", 0.0)
        assert pool.target() == 1
        pool._wake()
        deadline = time.monotonic() + FILL_S
        while pool.idle_count() > 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pool.idle_count() == 1
        removed = set(idle) - set(pool.idle_ids())
        assert len(removed) == 2
        for cid in removed:  # taken from the pool first, then removed from the engine
            while time.monotonic() < deadline:
                try:
                    provider._inspect(cid)
                except SandboxGone:
                    break
                time.sleep(0.05)
            with pytest.raises(SandboxGone):
                provider._inspect(cid)
    finally:
        for provider_id in made:
            provider.destroy(provider_id)
        provider.close()


def test_a_deep_agent_directory_still_lets_creates_claim(tmp_path):  # type: ignore[no-untyped-def]
    """The claim's probe of the agent's socket reached it by path, which fails past
    sun_path's 107 bytes ('AF_UNIX path too long'): with the server's var directory deep in
    the filesystem (a CI checkout) every claim dropped its container and started cold."""
    image = docker_provider_or_skip().image
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    provider = DockerProvider(
        image=image, installation=TEST_INSTALLATION, pool_size=1, agent_dir=deep
    )
    try:
        idle = full_pool(provider)
        socket_path = provider._agent_socket_path(idle[0])  # noqa: SLF001
        assert socket_path is not None and len(str(socket_path).encode()) > 107
        handle = provider.create(SandboxSpec(sandbox_id=new_id()))
        assert handle.provider_id == idle[0]  # claimed, not dropped for a cold start
        assert sh(provider, handle.provider_id, "echo claimed") == "claimed\n"
        provider.destroy(handle.provider_id)
    finally:
        provider.close()
