"""The local provider on cgroup v2, the unified hierarchy most current distributions mount alone.

Real bubblewrap and the real unified hierarchy, no mocks. This project's machine mounts every
limiting controller on v1 and the unified hierarchy beside them (at /sys/fs/cgroup/unified,
with no controller of its own but hugetlb), so here a provider forced to v2 gets what every v2
cgroup has (its processes, cgroup.freeze, cgroup.kill, cpu.stat) and the rlimits that stand in
for a missing memory or pids controller. The limits' own files (memory.max, pids.max,
cpu.max) are not written on this machine; no test here pretends they are.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandboxes.providers.base import ExecRequest, Resources, SandboxSpec
from sandboxes.providers.local import LocalProvider, jail, jail_cgroups
from sandboxes.providers.local.pool import PREFIX
from sandboxes.providers.local.snapshot import FROZEN, freezer_state
from tests.requirements import jail_root, missing_part
from tests.sandboxes.snippets import run_code

REPO = Path(__file__).resolve().parents[2]

FORK_BOMB = (
    "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
)


def _unified_root() -> str:
    top = jail_cgroups.unified_cgroup()
    if top is None:
        missing_part("a cgroup2 mount (the unified hierarchy)")
    if os.geteuid() != 0:
        missing_part("root, to make cgroups")
    return top


@pytest.fixture(scope="module")
def v2_provider() -> Iterator[LocalProvider]:
    _unified_root()
    provider = LocalProvider(root_dir=jail_root("cgroup-v2"), cgroup_version="v2")
    yield provider
    provider.close()


@pytest.fixture
def make_v2_sandbox(v2_provider: LocalProvider) -> Iterator[object]:
    made: list[str] = []

    def make(**spec_kw: object) -> str:
        handle = v2_provider.create(SandboxSpec(sandbox_id=uuid.uuid4().hex, **spec_kw))  # type: ignore[arg-type]
        made.append(handle.provider_id)
        return handle.provider_id

    yield make
    for provider_id in made:
        v2_provider.destroy(provider_id)


def _state(provider: LocalProvider, sandbox: str) -> jail.JailState:
    state = jail.JailState.load(provider.root_dir / sandbox / "state.json")
    assert state is not None
    return state


def _sh(provider: LocalProvider, sandbox: str, command: str, timeout_s: float = 30.0):  # type: ignore[no-untyped-def]
    return provider.exec(sandbox, ExecRequest(command=command, timeout_s=timeout_s))


def _wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    """Whether `condition` came true within `timeout_s` (checked every 20 ms)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _commands(cgroup: str) -> set[str]:
    names = set()
    for pid in jail_cgroups.cgroup_pids(cgroup):
        try:
            names.add(Path(f"/proc/{pid}/comm").read_text().strip())
        except OSError:
            pass
    return names


def _detach(provider: LocalProvider, sandbox: str, command: str) -> None:
    """Start `command` in the sandbox in a session of its own, outliving the API's command."""
    _sh(provider, sandbox, f"setsid {command} > /dev/null 2>&1 < /dev/null &")


def test_auto_takes_v1_only_where_it_has_memory_and_pids(tmp_path: Path) -> None:
    scope = f"test-auto-{uuid.uuid4().hex[:8]}"
    v1 = jail_cgroups.cgroup_bases(scope, "v1")
    auto = jail_cgroups.cgroup_bases(scope, "auto")
    try:
        if {"memory", "pids"} <= v1.keys():
            assert auto == v1
        else:
            assert jail_cgroups.UNIFIED in auto or not jail_cgroups.unified_cgroup()
    finally:
        jail_cgroups.cgroup_scope_remove(auto)
        jail_cgroups.cgroup_scope_remove(v1)
    with pytest.raises(ValueError, match="auto, v1, v2"):
        jail_cgroups.cgroup_bases(scope, "v3")


def test_an_unknown_cgroup_setting_stops_the_server_at_start() -> None:
    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=REPO,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "playground.settings",
            "SANDPIT_LOCAL_CGROUPS": "v3",
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "SANDPIT_LOCAL_CGROUPS must be auto, v1 or v2, got 'v3'" in result.stderr


def test_rlimits_stand_in_for_missing_controllers() -> None:
    res = Resources(memory_mb=64, pids=20)
    assert "RLIMIT_AS" not in jail.rlimits(res, {"memory", "pids"}, own_uid=True)
    assert "RLIMIT_NPROC" not in jail.rlimits(res, {"memory", "pids"}, own_uid=True)
    bare = jail.rlimits(res, set(), own_uid=True)
    assert bare["RLIMIT_AS"] == 64 * jail.MIB
    assert bare["RLIMIT_NPROC"] == 20
    # A jail sharing the server's uid would count the server's processes too.
    assert "RLIMIT_NPROC" not in jail.rlimits(res, set(), own_uid=False)


def test_jail_and_everything_it_starts_sit_in_its_own_v2_cgroup(v2_provider, make_v2_sandbox):  # type: ignore[no-untyped-def]
    top = _unified_root()
    sandbox = make_v2_sandbox()
    state = _state(v2_provider, sandbox)
    path = state.cgroups[jail_cgroups.UNIFIED]
    assert path == f"{top}/sandpit/{jail_cgroups.cgroup_scope(v2_provider.root_dir)}/{sandbox}"
    assert set(state.cgroups.values()) == {path}
    assert {"cpuacct", "freezer"} <= state.cgroups.keys()
    _detach(v2_provider, sandbox, "sleep 300")
    assert _wait_until(lambda: "sleep" in _commands(path))
    procs = jail_cgroups.cgroup_pids(path)
    assert state.jail_pid in procs
    # Only the jail's own: neither the server nor bwrap's outer process.
    assert os.getpid() not in procs and state.bwrap_pid not in procs


def test_pause_freezes_every_process_and_resume_thaws_them(v2_provider, make_v2_sandbox):  # type: ignore[no-untyped-def]
    sandbox = make_v2_sandbox()
    _detach(
        v2_provider, sandbox, "sh -c 'while :; do date +%s%N > /workspace/tick; sleep 0.02; done'"
    )
    state = _state(v2_provider, sandbox)
    tick = v2_provider.root_dir / sandbox / "workspace" / "tick"
    assert _wait_until(tick.exists)
    v2_provider.pause(sandbox)
    path = state.cgroups["freezer"]
    assert freezer_state(path) == FROZEN
    assert "frozen 1" in (jail.read_text(f"{path}/cgroup.events") or "").splitlines()
    frozen_at = tick.read_bytes()
    time.sleep(0.3)
    assert tick.read_bytes() == frozen_at
    v2_provider.resume(sandbox)
    assert _wait_until(lambda: tick.read_bytes() != frozen_at)
    assert _sh(v2_provider, sandbox, "echo awake").stdout == b"awake\n"


def test_destroy_kills_every_process_of_the_cgroup_and_removes_it(v2_provider, make_v2_sandbox):  # type: ignore[no-untyped-def]
    sandbox = make_v2_sandbox()
    for _ in range(3):
        _detach(v2_provider, sandbox, "sh -c 'trap \"\" TERM HUP; sleep 300'")
    path = _state(v2_provider, sandbox).cgroups[jail_cgroups.UNIFIED]
    # the agent, three shells, three sleeps
    assert _wait_until(lambda: len(jail_cgroups.cgroup_pids(path)) >= 7)
    pids = jail_cgroups.cgroup_pids(path)
    v2_provider.pause(sandbox)  # a frozen cgroup too
    assert v2_provider.destroy(sandbox)  # the fixture's destroy then finds it gone
    assert not os.path.exists(path)
    for pid in pids:
        status = Path(f"/proc/{pid}/status")
        assert not status.exists() or "State:\tZ" in status.read_text()


def test_a_fork_bomb_stops_at_the_sandboxs_pids_limit(v2_provider, make_v2_sandbox):  # type: ignore[no-untyped-def]
    """By pids.max where the host delegates the pids controller, else (here) by
    RLIMIT_NPROC, the stand-in."""
    victim = make_v2_sandbox(resources=Resources(pids=64))
    bystander = make_v2_sandbox()
    path = _state(v2_provider, victim).cgroups[jail_cgroups.UNIFIED]
    most = 0
    results: list[object] = []
    bomb = threading.Thread(
        target=lambda: results.append(
            run_code(v2_provider, victim, FORK_BOMB, "python", timeout_s=5)
        )
    )
    bomb.start()
    try:
        while bomb.is_alive():
            tasks = (jail.read_text(f"{path}/cgroup.threads") or "").split()
            most = max(most, len(tasks))
            assert _sh(v2_provider, bystander, "echo ok").stdout == b"ok\n"
    finally:
        bomb.join(timeout=120)
    result = results[0]
    assert result.timed_out and result.exit_code == -9  # type: ignore[attr-defined]
    # 64 tasks of the sandbox's uid: the agent and its threads count, as in a pids cgroup.
    assert 10 < most <= 64
    assert _sh(v2_provider, victim, "echo recovered").stdout == b"recovered\n"


def test_a_claimed_warm_jail_counts_cpu_from_its_claim() -> None:
    _unified_root()
    provider = LocalProvider(root_dir=jail_root("cgroup-v2-warm"), cgroup_version="v2", warm_pool=1)
    try:
        provider.warm_pool_start()
        assert provider._pool is not None and provider._pool.wait_full(60)
        sandbox = provider.create(SandboxSpec(sandbox_id=uuid.uuid4().hex)).provider_id
    except BaseException:
        provider.close()
        raise
    try:
        state = _state(provider, sandbox)
        assert f"/{PREFIX}" in state.cgroups[jail_cgroups.UNIFIED]  # a claimed warm jail
        # Its start-up's CPU (the agent's interpreter) is not the sandbox's.
        assert state.cpu_base_ns > 0
        used = jail_cgroups.cgroup_cpu_ns(state.cgroups)
        assert used is not None and used >= state.cpu_base_ns
        stats = provider.stats(sandbox)
        uptime = max(1e-6, time.time() - state.created_at)
        unbased = used / 1e9 / uptime * 100
        assert stats.cpu_percent < unbased
    finally:
        provider.destroy(sandbox)
        provider.close()


def test_health_names_v2_and_what_stands_in_for_missing_controllers(v2_provider):  # type: ignore[no-untyped-def]
    detail = v2_provider.health().detail
    assert "cgroup v2 limits:" in detail
    if "pids" not in v2_provider._cgroup_bases:
        assert "RLIMIT_NPROC" in detail
    if "memory" not in v2_provider._cgroup_bases:
        assert "RLIMIT_AS" in detail


@pytest.fixture
def hugetlb_cgroup() -> Iterator[str]:
    """A cgroup of the unified hierarchy's root that the hugetlb controller reaches: the one
    controller this machine's unified hierarchy has, enough to make the kernel refuse to
    hand a controller down past a cgroup holding processes."""
    top = _unified_root()
    root = top if jail_cgroups._own_cgroups().get(jail_cgroups.UNIFIED) == "/" else ""
    if not root or "hugetlb" not in (jail.read_text(f"{root}/cgroup.controllers") or "").split():
        missing_part("our process at the unified root, with the hugetlb controller there")
    had = "hugetlb" in jail_cgroups._subtree(root)
    assert had or jail_cgroups._subtree_enable(root, "hugetlb") == 0
    path = f"{root}/sandpit-test-{uuid.uuid4().hex[:8]}"
    os.mkdir(path)
    try:
        yield path
    finally:
        for leaf in (
            f"{path}/sandpit/scope",
            f"{path}/sandpit",
            f"{path}/{jail_cgroups.HOST_LEAF}",
            path,
        ):
            if os.path.isdir(leaf):
                jail_cgroups._write(f"{leaf}/cgroup.kill", 1)
                for _ in range(200):
                    try:
                        os.rmdir(leaf)
                        break
                    except OSError:
                        time.sleep(0.01)
        if not had:
            with open(f"{root}/cgroup.subtree_control", "w") as f:
                f.write("-hugetlb")


def _sleeper_in(cgroup: str) -> subprocess.Popen[bytes]:
    sleeper = subprocess.Popen(["sleep", "300"])
    assert jail_cgroups._write(f"{cgroup}/cgroup.procs", sleeper.pid)
    return sleeper


def test_controllers_pass_a_cgroup_holding_processes_only_where_delegated(
    hugetlb_cgroup: str,
) -> None:
    chain = [hugetlb_cgroup, f"{hugetlb_cgroup}/sandpit", f"{hugetlb_cgroup}/sandpit/scope"]
    for path in chain[1:]:
        os.mkdir(path)
    sleeper = _sleeper_in(hugetlb_cgroup)
    try:
        # Not ours to arrange: nothing moves, and the controller does not pass.
        assert jail_cgroups._v2_enable(chain, ("hugetlb",)) == []
        assert jail_cgroups.cgroup_pids(hugetlb_cgroup) == [sleeper.pid]
        # Delegated (as systemd marks it): its processes move into the leaf, keeping every
        # limit above them, and the controller reaches the jails' parent.
        os.setxattr(hugetlb_cgroup, "trusted.delegate", b"1")
        assert jail_cgroups._v2_enable(chain, ("hugetlb",)) == ["hugetlb"]
        assert jail_cgroups.cgroup_pids(hugetlb_cgroup) == []
        assert jail_cgroups.cgroup_pids(f"{hugetlb_cgroup}/{jail_cgroups.HOST_LEAF}") == [
            sleeper.pid
        ]
        assert "hugetlb" in jail_cgroups._subtree(chain[-1])
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_process_moved_into_the_leaf_finds_the_cgroup_it_came_from(hugetlb_cgroup: str) -> None:
    leaf = f"{hugetlb_cgroup}/{jail_cgroups.HOST_LEAF}"
    os.mkdir(leaf)
    probe = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; sys.stdin.readline(); "
            "from sandboxes.providers.local import jail_cgroups; print(jail_cgroups.unified_cgroup())",
        ],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert jail_cgroups._write(f"{leaf}/cgroup.procs", probe.pid)
    out, _ = probe.communicate("\n", timeout=60)
    assert out.strip() == hugetlb_cgroup


def test_the_setting_picks_the_hierarchy_of_the_product_s_provider(settings) -> None:  # type: ignore[no-untyped-def]
    from sandboxes.providers import _build_local

    _unified_root()
    settings.SANDPIT_LOCAL_ROOT = jail_root("cgroup-setting")
    settings.SANDPIT_LOCAL_WARM_POOL = 0
    settings.SANDPIT_LOCAL_CGROUPS = "v2"
    provider = _build_local()
    try:
        assert jail_cgroups.UNIFIED in provider._cgroup_bases  # type: ignore[attr-defined]
        assert "cgroup v2 limits" in provider.health().detail
    finally:
        provider.close()  # type: ignore[attr-defined]
