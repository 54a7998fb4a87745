"""LocalProvider with a warm pool: a claimed jail behaves like one started cold, the
pool belongs to one process, and nothing is left behind.

Real bubblewrap, real cgroups, no mocks (one test injects a failed claim).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandboxes.providers import burst_sizing
from sandboxes.providers.base import (
    Capability,
    ExecRequest,
    ExecResult,
    InvalidRequest,
    Resources,
    SandboxGone,
    SandboxSpec,
    SandboxState,
)
from sandboxes.providers.local import LocalProvider, jail, jail_cgroups
from sandboxes.providers.local import pool as warm_pool
from sandboxes.providers.local.pool import (
    BURST_HOLD_S,
    PREFIX,
    REFILL_QUIET_S,
    WarmJail,
    WarmPool,
)
from sandboxes.providers.local.provider import LocalWarmReservation
from tests.requirements import jail_root, missing_part
from tests.sandboxes.snippets import run_code

REPO = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024

MakeSandbox = Callable[..., str]

NOT_THE_POOLS = Resources(pids=100)
"""Resources a warm jail does not start with, so that its claim writes the limits (the
tests that fail or hold a claim there use them)."""


@pytest.fixture(scope="module")
def warm_provider(tmp_path_factory) -> Iterator[LocalProvider]:  # type: ignore[no-untyped-def]
    provider = LocalProvider(root_dir=jail_root("warm-sandboxes"), warm_pool=2)
    yield provider
    provider.close()


@pytest.fixture
def make_warm(warm_provider) -> Iterator[MakeSandbox]:  # type: ignore[no-untyped-def]
    """Create sandboxes that claim a warm jail (the pool is full before each create)."""
    created: list[str] = []

    def make(**spec_kw) -> str:  # type: ignore[no-untyped-def]
        assert warm_provider._pool.wait_full(30), "the warm pool did not fill"
        handle = warm_provider.create(SandboxSpec(sandbox_id=uuid.uuid4().hex, **spec_kw))
        created.append(handle.provider_id)
        assert _was_warm(warm_provider, handle.provider_id)
        return handle.provider_id

    yield make
    for provider_id in created:
        warm_provider.destroy(provider_id)


def _state(provider: LocalProvider, provider_id: str) -> dict:
    return json.loads((provider.root_dir / provider_id / "state.json").read_text())


def _was_warm(provider: LocalProvider, provider_id: str) -> bool:
    """Claimed jails keep the cgroups they were started in, named after the pool jail."""
    return all(f"/{PREFIX}" in path for path in _state(provider, provider_id)["cgroups"].values())


def _pool_dirs(root: Path) -> set[str]:
    return {entry for entry in os.listdir(root) if entry.startswith(PREFIX)}


def sh(provider: LocalProvider, sandbox: str, command: str, **kw) -> ExecResult:  # type: ignore[no-untyped-def]
    return provider.exec(sandbox, ExecRequest(command=command, timeout_s=30, **kw))


def _wait(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.02)


# ---------------------------------------------------------------------------
# claiming
# ---------------------------------------------------------------------------


def test_create_claims_a_warm_jail_and_the_pool_refills(warm_provider, make_warm):
    """That the jail was warm, make_warm asserts (its cgroups are the pool jail's); how
    quick a claim is, bench/ measures (no wall-clock threshold here)."""
    assert warm_provider._pool.wait_full(30)
    sandbox = make_warm(labels={"k": "v"})
    state = _state(warm_provider, sandbox)
    assert state["sandbox_id"] == sandbox
    assert state["labels"] == {"k": "v"}
    assert state["pool_owner_pid"] == 0
    assert warm_provider.get(sandbox).state == SandboxState.RUNNING
    assert warm_provider._pool.wait_full(30)
    assert len(_pool_dirs(warm_provider.root_dir)) == 2


def test_claimed_jail_runs_commands_files_and_processes(warm_provider, make_warm):
    sandbox = make_warm()
    result = sh(warm_provider, sandbox, "echo out; echo err >&2; pwd; exit 3")
    assert (result.stdout, result.stderr, result.exit_code) == (b"out\n/workspace\n", b"err\n", 3)
    warm_provider.write_file(sandbox, "dir/a.txt", b"hello")
    assert sh(warm_provider, sandbox, "cat dir/a.txt").stdout == b"hello"
    sh(warm_provider, sandbox, "echo made > b.txt")
    assert warm_provider.read_file(sandbox, "b.txt") == b"made\n"
    assert {e.name for e in warm_provider.list_files(sandbox, ".")} >= {"dir", "b.txt"}
    proc = warm_provider.start_process(sandbox, "sleep", args=["1000"])
    assert proc.pid in {p.pid for p in warm_provider.list_processes(sandbox) if p.running}
    assert run_code(warm_provider, sandbox, "print(6 * 7)", "python").stdout == b"42\n"


def test_a_warm_jail_loads_libc_ahead_and_the_terminal_ops_on_first_use(warm_provider, make_warm):
    """The pool refills while requests are served, so a warm jail loads ahead only what
    its claim's first command needs: libc's posix_spawn (ctypes), which starts it without
    the exec shim's extra exec. The terminal and session ops (termios) load as a cold
    jail's do, on first use."""
    sandbox = make_warm()
    time.sleep(0.3)  # an agent loading them as it starts would have by now (10-40 ms)
    maps = sh(warm_provider, sandbox, "cat /proc/1/maps").stdout
    assert b"python3" in maps  # the agent's own map
    assert b"_ctypes" in maps and b"termios" not in maps
    session = warm_provider.open_pty(sandbox)
    session.close()
    assert b"termios" in sh(warm_provider, sandbox, "cat /proc/1/maps").stdout


def test_spec_env_reaches_exec_processes_and_terminals(warm_provider, make_warm):
    sandbox = make_warm(env={"GREETING": "hello warm", "HOME": "/tmp"})
    assert sh(warm_provider, sandbox, 'echo "$GREETING $HOME $USER"').stdout == (
        b"hello warm /tmp sandbox\n"
    )
    overridden = sh(warm_provider, sandbox, "echo $GREETING", env={"GREETING": "request"})
    assert overridden.stdout == b"request\n"
    warm_provider.start_process(sandbox, "sh", args=["-c", 'echo "$GREETING" > from-process'])
    _wait(lambda: warm_provider.exists(sandbox, "from-process"))
    _wait(lambda: warm_provider.read_file(sandbox, "from-process") == b"hello warm\n")
    pty = warm_provider.open_pty(sandbox)
    try:
        pty.write(b'echo "[$GREETING]"\n')
        seen = b""
        end = time.monotonic() + 10
        while b"[hello warm]" not in seen:
            assert time.monotonic() < end, seen
            select.select([pty.fileno()], [], [], 0.5)
            try:
                seen += pty.read()
            except BlockingIOError:
                continue
    finally:
        pty.close()


def test_other_sandboxes_do_not_inherit_a_claimed_jails_env(warm_provider, make_warm):
    make_warm(env={"ONLY_MINE": "1"})
    other = make_warm()
    assert sh(warm_provider, other, "echo ${ONLY_MINE:-unset}").stdout == b"unset\n"


def test_claim_applies_the_specs_resources(warm_provider, make_warm):
    res = Resources(memory_mb=96, cpu_count=0.5, pids=40, disk_mb=24, open_files=77)
    sandbox = make_warm(resources=res)
    assert sh(warm_provider, sandbox, "ulimit -n; ulimit -f").stdout == (
        f"77\n{24 * MIB // 512}\n".encode()
    )
    cgroups = _state(warm_provider, sandbox)["cgroups"]
    if "memory" in cgroups:
        limit = jail.read_text(f"{cgroups['memory']}/memory.limit_in_bytes")
        assert int(limit or 0) == 96 * MIB
    if "pids" in cgroups:
        assert (jail.read_text(f"{cgroups['pids']}/pids.max") or "").strip() == "40"
    if "cpu" in cgroups:
        assert int(jail.read_text(f"{cgroups['cpu']}/cpu.cfs_quota_us") or 0) == 50_000
        idle = jail.read_text(f"{cgroups['cpu']}/cpu.idle")
        assert idle is None or idle.strip() == "0"
    if os.geteuid() == 0:  # the workspace tmpfs was resized
        st = os.statvfs(warm_provider.root_dir / sandbox / "workspace")
        assert st.f_blocks * st.f_frsize == 24 * MIB
    assert _state(warm_provider, sandbox)["resources"]["memory_mb"] == 96


def _limits(cgroups: dict[str, str]) -> dict[str, str | None]:
    """The limits a jail's cgroups hold, by file."""
    files = {
        "memory": "memory.limit_in_bytes",
        "pids": "pids.max",
        "cpu": "cpu.cfs_quota_us",
    }
    return {
        name: (jail.read_text(f"{cgroups[ctrl]}/{name}") or "").strip() or None
        for ctrl, name in files.items()
        if ctrl in cgroups
    }


def _default_limits() -> dict[str, str]:
    res = Resources()
    return {
        "memory.limit_in_bytes": str(res.memory_mb * MIB),
        "pids.max": str(res.pids),
        "cpu.cfs_quota_us": str(int(res.cpu_count * 100_000)),
    }


def test_a_claim_with_the_pools_resources_writes_no_limit_and_keeps_them(
    warm_provider, make_warm, monkeypatch
):
    """A warm jail already holds the default limits: the claim does not write them again
    (the CPU quota's write alone cost ~0.3 ms of a create), and the sandbox has them."""
    written: list[object] = []
    write_limits = jail_cgroups.cgroups_set_limits
    claiming = threading.current_thread()

    def noting(paths: dict[str, str], res: Resources) -> bool:
        if threading.current_thread() is claiming:  # not the pool's refills
            written.append(paths)
        return write_limits(paths, res)

    monkeypatch.setattr(jail_cgroups, "cgroups_set_limits", noting)
    sandbox = make_warm(resources=Resources())
    assert written == []
    limits = _limits(_state(warm_provider, sandbox)["cgroups"])
    assert limits == {k: v for k, v in _default_limits().items() if k in limits}
    assert sh(warm_provider, sandbox, "ulimit -n").stdout == b"1024\n"
    if os.geteuid() == 0:
        st = os.statvfs(warm_provider.root_dir / sandbox / "workspace")
        assert st.f_blocks * st.f_frsize == Resources().disk_mb * MIB


def test_a_warm_jail_whose_limits_were_not_all_written_gets_them_at_its_claim(
    warm_provider, make_warm
):
    """Where the start could not write a limit, its state says so and the claim writes
    them all, even for the pool's own resources (a stand-in: an idle jail's pids limit
    lifted and its state marked as a failed start would leave them)."""
    assert warm_provider._pool.wait_full(30)
    for name in _pool_dirs(warm_provider.root_dir):
        state_file = warm_provider.root_dir / name / "state.json"
        state = json.loads(state_file.read_text())
        if "pids" not in state["cgroups"]:
            missing_part("the pids cgroup controller")
        assert state["resources"] == Resources().__dict__
        assert jail_cgroups._write(f"{state['cgroups']['pids']}/pids.max", "max")
        state["resources"] = None
        state_file.write_text(json.dumps(state))
    sandbox = make_warm(resources=Resources())
    cgroups = _state(warm_provider, sandbox)["cgroups"]
    assert (jail.read_text(f"{cgroups['pids']}/pids.max") or "").strip() == str(Resources().pids)
    assert _state(warm_provider, sandbox)["resources"] == Resources().__dict__


def test_a_start_whose_limits_could_not_all_be_written_says_so(monkeypatch):
    """What the test above stands in for: a jail started while a limit's write failed
    records no resources, so that its claim would write them all."""
    provider = LocalProvider(root_dir=jail_root("unlimited"))
    monkeypatch.setattr(jail_cgroups, "cgroups_set_limits", lambda paths, res: False)
    handle = provider.create(SandboxSpec(sandbox_id=uuid.uuid4().hex))
    try:
        assert _state(provider, handle.provider_id)["resources"] is None
    finally:
        provider.destroy(handle.provider_id)
        provider.close()


def test_memory_bomb_in_a_claimed_jail_is_killed(warm_provider, make_warm):
    sandbox = make_warm(resources=Resources(memory_mb=64))
    code = "chunks = []\nwhile True:\n    chunks.append(b'x' * 20_000_000)\n"
    result = run_code(warm_provider, sandbox, code, "python", timeout_s=60)
    assert result.exit_code == -9
    assert result.oom_killed
    assert not result.timed_out
    assert sh(warm_provider, sandbox, "echo recovered").stdout == b"recovered\n"


def test_disk_mb_of_a_claimed_jail_is_honoured(warm_provider, make_warm):
    sandbox = make_warm(resources=Resources(disk_mb=8))
    result = sh(warm_provider, sandbox, "dd if=/dev/zero of=big bs=1M count=100")
    assert result.exit_code != 0
    assert warm_provider.stat(sandbox, "big").size <= 8 * MIB
    if os.geteuid() == 0:  # the volume, not just the per-file limit
        many = "for i in $(seq 1 20); do head -c 1048576 /dev/zero > /tmp/f$i || exit 1; done"
        assert sh(warm_provider, sandbox, f"rm -f big; {many}").exit_code != 0
        assert warm_provider.stats(sandbox).disk_bytes <= 8 * MIB


def test_stats_of_a_claimed_jail_start_at_the_claim(warm_provider, make_warm):
    sandbox = make_warm()
    stats = warm_provider.stats(sandbox)
    assert 0 <= stats.uptime_s < 5
    assert 0 <= stats.cpu_percent < 400
    assert stats.process_count == 0


def test_destroying_a_claimed_jail_cleans_everything(warm_provider, make_warm):
    sandbox = make_warm()
    warm_provider.start_process(sandbox, "sleep", args=["1000"])
    root = warm_provider.root_dir
    state = _state(warm_provider, sandbox)
    assert warm_provider.destroy(sandbox)
    assert not (root / sandbox).exists()
    for path in state["cgroups"].values():
        assert not os.path.exists(path)
    assert jail.start_ticks(state["jail_pid"]) != state["jail_start_ticks"]
    with open("/proc/mounts") as f:
        assert str(root / sandbox) not in f.read()
    assert warm_provider.destroy(sandbox) is False


def test_list_shows_claimed_jails_and_hides_our_idle_ones(warm_provider, make_warm):
    sandbox = make_warm()
    assert warm_provider._pool.wait_full(30)
    listed = {h.provider_id for h in warm_provider.list_sandboxes()}
    assert sandbox in listed
    assert not any(pid.startswith(PREFIX) for pid in listed)


def test_duplicate_sandbox_id_is_refused_without_spending_a_warm_jail(warm_provider, make_warm):
    sandbox = make_warm()
    assert warm_provider._pool.wait_full(30)
    before = _pool_dirs(warm_provider.root_dir)
    with pytest.raises(InvalidRequest):
        warm_provider.create(SandboxSpec(sandbox_id=sandbox))
    assert _pool_dirs(warm_provider.root_dir) == before
    assert sh(warm_provider, sandbox, "echo still").stdout == b"still\n"


def test_networked_sandbox_is_started_cold(warm_provider):
    if Capability.NETWORK not in warm_provider.capabilities:
        missing_part("network=True needs slirp4netns and nftables")
    assert warm_provider._pool.wait_full(30)
    before = _pool_dirs(warm_provider.root_dir)
    handle = warm_provider.create(SandboxSpec(sandbox_id=uuid.uuid4().hex, network=True))
    try:
        assert not _was_warm(warm_provider, handle.provider_id)
        assert _pool_dirs(warm_provider.root_dir) == before
    finally:
        warm_provider.destroy(handle.provider_id)


def test_concurrent_creates_never_share_a_jail(warm_provider):
    assert warm_provider._pool.wait_full(30)
    ids: list[str] = []
    errors: list[BaseException] = []

    def create() -> None:
        try:
            ids.append(warm_provider.create(SandboxSpec(sandbox_id=uuid.uuid4().hex)).provider_id)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=create) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    try:
        assert not errors
        assert len(ids) == 6
        assert sum(_was_warm(warm_provider, sid) for sid in ids) >= 1
        jail_pids = {_state(warm_provider, sid)["jail_pid"] for sid in ids}
        assert len(jail_pids) == 6
        for sid in ids:
            warm_provider.write_file(sid, "me", sid.encode())
        for sid in ids:
            assert sh(warm_provider, sid, "cat me").stdout == sid.encode()
    finally:
        for sid in ids:
            warm_provider.destroy(sid)


def test_a_failed_claim_falls_back_to_a_cold_start(warm_provider, monkeypatch):
    assert warm_provider._pool.wait_full(30)
    before = _pool_dirs(warm_provider.root_dir)
    set_limits = jail_cgroups.cgroups_set_limits

    def refuse_warm(paths: dict[str, str], res: Resources) -> bool:
        warm = any(f"/{PREFIX}" in path for path in paths.values())
        return not warm and set_limits(paths, res)

    monkeypatch.setattr(jail_cgroups, "cgroups_set_limits", refuse_warm)
    handle = warm_provider.create(
        SandboxSpec(sandbox_id=uuid.uuid4().hex, env={"A": "b"}, resources=NOT_THE_POOLS)
    )
    monkeypatch.undo()
    try:
        assert not _was_warm(warm_provider, handle.provider_id)
        assert sh(warm_provider, handle.provider_id, "echo $A").stdout == b"b\n"
        # the warm jail that could not be claimed was destroyed
        assert len(before - _pool_dirs(warm_provider.root_dir)) == 1
    finally:
        warm_provider.destroy(handle.provider_id)


# ---------------------------------------------------------------------------
# reserving: a warm jail set aside before the create is admitted
# ---------------------------------------------------------------------------


def test_a_released_reservation_is_the_next_creates_jail_unchanged(warm_provider):
    """A create refused after its reservation (its organization at its limit) spends no
    warm jail: the very jail goes back, first in line, and the next create adopts it."""
    assert warm_provider._pool.wait_full(30)
    before = _pool_dirs(warm_provider.root_dir)
    reserved = warm_provider.warm_reserve(SandboxSpec(sandbox_id=uuid.uuid4().hex))
    assert reserved is not None and reserved.engine == ""
    assert warm_provider._pool.idle_count() == 1
    set_aside = {d for d in before if d not in {w.jail_id for w in warm_provider._pool._idle}}
    assert len(set_aside) == 1
    reserved.release()
    reserved.release()  # once only: a second release gives nothing back twice
    assert warm_provider._pool.idle_count() == 2
    assert _pool_dirs(warm_provider.root_dir) == before
    assert not (warm_provider.root_dir / reserved.provider_id).exists()  # its directory too
    nxt = warm_provider.create(SandboxSpec(sandbox_id=uuid.uuid4().hex))
    try:
        assert _was_warm(warm_provider, nxt.provider_id)
        assert set_aside == {
            Path(p).name for p in _state(warm_provider, nxt.provider_id)["cgroups"].values()
        }
        assert sh(warm_provider, nxt.provider_id, "echo ok").stdout == b"ok\n"
    finally:
        warm_provider.destroy(nxt.provider_id)


def test_an_adopted_reservation_is_the_sandbox_the_spec_asked_for(warm_provider):
    assert warm_provider._pool.wait_full(30)
    sandbox_id = uuid.uuid4().hex
    spec = SandboxSpec(sandbox_id=sandbox_id, env={"WHO": "me"}, labels={"k": "v"})
    reserved = warm_provider.warm_reserve(spec)
    assert reserved is not None and reserved.provider_id == sandbox_id
    # Its directory only, empty, so that a destroy from now on finds it.
    assert list((warm_provider.root_dir / sandbox_id).iterdir()) == []
    handle = reserved.adopt()
    try:
        assert handle.provider_id == sandbox_id and handle.labels == {"k": "v"}
        assert _was_warm(warm_provider, sandbox_id)
        assert sh(warm_provider, sandbox_id, "echo $WHO").stdout == b"me\n"
        with pytest.raises(RuntimeError):
            reserved.adopt()
        reserved.release()  # after the adopt: nothing to give back
        assert warm_provider.get(sandbox_id).state == SandboxState.RUNNING
    finally:
        warm_provider.destroy(sandbox_id)


def test_no_reservation_for_a_spec_a_warm_jail_cannot_serve(warm_provider):
    """Those go through create, which starts them cold or says what is wrong; nothing is
    taken from the pool."""
    assert warm_provider._pool.wait_full(30)
    before = _pool_dirs(warm_provider.root_dir)
    for spec in (
        SandboxSpec(sandbox_id=uuid.uuid4().hex, network=True),
        SandboxSpec(sandbox_id=uuid.uuid4().hex, rootfs="/nonexistent"),
        SandboxSpec(sandbox_id=uuid.uuid4().hex, restore_from="/nonexistent"),
        SandboxSpec(sandbox_id="../escape"),
        SandboxSpec(sandbox_id=uuid.uuid4().hex, env={"A=B": "c"}),
    ):
        assert warm_provider.warm_reserve(spec) is None, spec
    assert warm_provider._pool.idle_count() == 2
    assert _pool_dirs(warm_provider.root_dir) == before
    cold = LocalProvider(root_dir=jail_root("cold"), warm_pool=0)
    assert cold.warm_reserve(SandboxSpec(sandbox_id=uuid.uuid4().hex)) is None


def test_a_reservation_whose_jail_fails_is_started_cold_under_its_id(warm_provider, monkeypatch):
    assert warm_provider._pool.wait_full(30)
    sandbox_id = uuid.uuid4().hex
    reserved = warm_provider.warm_reserve(
        SandboxSpec(sandbox_id=sandbox_id, env={"A": "b"}, resources=NOT_THE_POOLS)
    )
    assert reserved is not None
    set_limits = jail_cgroups.cgroups_set_limits

    def refuse_warm(paths: dict[str, str], res: Resources) -> bool:
        warm = any(f"/{PREFIX}" in path for path in paths.values())
        return not warm and set_limits(paths, res)

    monkeypatch.setattr(jail_cgroups, "cgroups_set_limits", refuse_warm)
    handle = reserved.adopt()
    monkeypatch.undo()
    try:
        assert handle.provider_id == sandbox_id
        assert not _was_warm(warm_provider, sandbox_id)
        assert sh(warm_provider, sandbox_id, "echo $A").stdout == b"b\n"
    finally:
        warm_provider.destroy(sandbox_id)


def test_no_reservation_for_an_id_already_taken(warm_provider, make_warm):
    """The jail goes back at once, and the create that follows says why."""
    sandbox = make_warm()
    assert warm_provider._pool.wait_full(30)
    before = _pool_dirs(warm_provider.root_dir)
    assert warm_provider.warm_reserve(SandboxSpec(sandbox_id=sandbox)) is None
    with pytest.raises(InvalidRequest):
        warm_provider.create(SandboxSpec(sandbox_id=sandbox))
    assert _pool_dirs(warm_provider.root_dir) == before
    assert warm_provider._pool.idle_count() == 2
    assert sh(warm_provider, sandbox, "echo still").stdout == b"still\n"


def _jail_pids(provider: LocalProvider, names: set[str]) -> dict[str, int]:
    return {name: _state(provider, name)["jail_pid"] for name in names}


def _reserve_one(provider: LocalProvider) -> tuple[str, LocalWarmReservation, str, dict[str, int]]:
    """A reservation on a full pool: the sandbox's id, the reservation, the name of the
    jail it set aside, and every idle jail's pid (by name) before it."""
    assert provider._pool.wait_full(30)
    sandbox_id = uuid.uuid4().hex
    idle = _jail_pids(provider, _pool_dirs(provider.root_dir))
    reserved = provider.warm_reserve(SandboxSpec(sandbox_id=sandbox_id))
    assert isinstance(reserved, LocalWarmReservation)
    taken = next(n for n in idle if n not in {w.jail_id for w in provider._pool._idle})
    return sandbox_id, reserved, taken, idle


def _alive(pid: int) -> bool:
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) not in "ZX"
    except OSError:
        return False


def test_a_sandbox_destroyed_before_its_reservation_is_adopted_leaves_no_jail(warm_provider):
    """The row of a warm create goes in, already running, before the jail is adopted: a
    destroy landing in between finds the sandbox's directory, removes it, and the adoption
    then ends the jail instead of leaving it running with no sandbox."""
    sandbox_id, reserved, taken, idle = _reserve_one(warm_provider)
    assert warm_provider.destroy(sandbox_id) is True
    with pytest.raises(SandboxGone):
        reserved.adopt()
    assert not (warm_provider.root_dir / sandbox_id).exists()
    assert not (warm_provider.root_dir / taken).exists()
    _wait(lambda: not _alive(idle[taken]))
    assert all(_alive(pid) for name, pid in idle.items() if name != taken)
    assert warm_provider._pool.wait_full(30)  # and the pool refills


def test_a_sandbox_destroyed_just_after_its_jail_moved_in_leaves_no_jail(
    warm_provider, monkeypatch
):
    """The narrower window: the destroy lands after the jail's directory took the
    sandbox's place but before its state names the sandbox. The destroy ends the jail
    from what the state says, and the adoption neither restarts it cold nor leaves it."""
    sandbox_id, reserved, taken, idle = _reserve_one(warm_provider)
    save = jail.JailState.save

    def destroyed_first(state: jail.JailState, path: Path) -> None:
        if path.parent.name == sandbox_id:
            assert warm_provider.destroy(sandbox_id) is True
        save(state, path)

    monkeypatch.setattr(jail.JailState, "save", destroyed_first)
    with pytest.raises(SandboxGone):
        reserved.adopt()
    monkeypatch.undo()
    assert not (warm_provider.root_dir / sandbox_id).exists()
    assert not (warm_provider.root_dir / taken).exists()
    _wait(lambda: not _alive(idle[taken]))
    assert all(_alive(pid) for name, pid in idle.items() if name != taken)


def test_a_directory_moves_onto_a_reserved_one_only_while_it_is_there(tmp_path):
    src, reserved = tmp_path / "warm", tmp_path / "sandbox"
    src.mkdir()
    (src / "state.json").write_text("{}")
    reserved.mkdir()
    assert jail.move_onto_reserved(src, reserved)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sandbox"]
    assert (reserved / "state.json").read_text() == "{}"
    again = tmp_path / "warm2"
    again.mkdir()
    assert not jail.move_onto_reserved(again, tmp_path / "destroyed")
    assert again.is_dir() and not (tmp_path / "destroyed").exists()
    with pytest.raises(OSError):
        jail.move_onto_reserved(tmp_path / "gone", reserved)


def test_a_jail_given_back_to_a_closed_pool_is_destroyed():
    root = jail_root("warm-closed")
    provider = LocalProvider(root_dir=root, warm_pool=1)
    try:
        assert provider._pool is not None
        provider.warm_pool_start()
        assert provider._pool.wait_full(30)
        reserved = provider.warm_reserve(SandboxSpec(sandbox_id=uuid.uuid4().hex))
        assert reserved is not None
        provider.close()
        assert len(_pool_dirs(root)) == 1  # close() destroyed the idle ones only
        reserved.release()
        assert _pool_dirs(root) == set()
    finally:
        provider.close()


# ---------------------------------------------------------------------------
# priority: refills in the background, sandboxes at the server's own
# ---------------------------------------------------------------------------


def _nice(stat: Path) -> int:
    """The nice value in a /proc/<pid>/stat (or task/<tid>/stat): its 19th field."""
    return int(stat.read_text().rsplit(")", 1)[1].split()[16])


def _thread_nice(thread: threading.Thread) -> int:
    assert thread.native_id is not None
    return _nice(Path(f"/proc/self/task/{thread.native_id}/stat"))


def test_refills_run_at_the_lowest_priority_and_sandboxes_at_the_servers(warm_provider):
    """The refill workers' Python runs at BACKGROUND_NICE; the jails they start (and any
    thread the start creates) at the priority the process runs at, which a claimed
    sandbox's commands then have too: nice is inherited, and a sandbox must not run at the
    refill's."""
    base = os.getpriority(os.PRIO_PROCESS, 0)
    if base >= warm_pool.BACKGROUND_NICE:
        missing_part("this test process already runs at the lowest priority")
    assert warm_provider._pool.wait_full(30)
    workers = warm_provider._pool._threads
    assert workers and all(_thread_nice(t) == warm_pool.BACKGROUND_NICE for t in workers)
    reaper = [t for t in threading.enumerate() if t.name == "sandpit-local-reaper"]
    assert reaper and all(_thread_nice(t) == base for t in reaper)
    for jail_id in _pool_dirs(warm_provider.root_dir):
        state = _state(warm_provider, jail_id)
        for pid in (state["bwrap_pid"], state["jail_pid"]):
            assert _nice(Path(f"/proc/{pid}/stat")) == base, (jail_id, pid)
    sandbox = warm_provider.create(SandboxSpec(sandbox_id=uuid.uuid4().hex))
    try:
        assert _was_warm(warm_provider, sandbox.provider_id)
        assert sh(warm_provider, sandbox.provider_id, "nice").stdout == f"{base}\n".encode()
    finally:
        warm_provider.destroy(sandbox.provider_id)


def test_refills_keep_the_servers_priority_where_they_could_not_come_back(
    warm_provider, monkeypatch
):
    """Without the right to raise a priority again (no CAP_SYS_NICE nor RLIMIT_NICE: the
    kernel's rule, stood in for here since this test runs as root), the workers stay at the
    process's priority rather than start jails at theirs."""
    base = os.getpriority(os.PRIO_PROCESS, 0)
    if base >= warm_pool.BACKGROUND_NICE:
        missing_part("this test process already runs at the lowest priority")
    set_priority = os.setpriority

    def unprivileged(which: int, who: int, value: int) -> None:
        if value < os.getpriority(which, who):
            raise PermissionError(1, "Operation not permitted")
        set_priority(which, who, value)

    assert warm_provider._pool.wait_full(30)  # no refill of its under the stand-in
    monkeypatch.setattr(warm_pool.os, "setpriority", unprivileged)
    provider = LocalProvider(root_dir=jail_root("warm-nice"), warm_pool=1)
    try:
        provider.warm_pool_start()
        assert provider._pool is not None and provider._pool.wait_full(30)
        assert [_thread_nice(t) for t in provider._pool._threads] == [base]
        (jail_id,) = _pool_dirs(provider.root_dir)
        assert _nice(Path(f"/proc/{_state(provider, jail_id)['jail_pid']}/stat")) == base
    finally:
        provider.close()


# ---------------------------------------------------------------------------
# ownership: one process's pool, cleaned up by close(), exit, or the reconciler
# ---------------------------------------------------------------------------


def test_close_destroys_unclaimed_jails():
    jails = jail_root("warm")
    provider = LocalProvider(root_dir=jails, warm_pool=2)
    assert provider._pool is not None
    assert provider._pool.wait_full(30)
    states = [_state(provider, name) for name in _pool_dirs(jails)]
    assert len(states) == 2
    provider.close()
    assert _pool_dirs(jails) == set()
    for state in states:
        assert all(not os.path.exists(path) for path in state["cgroups"].values())
        assert jail.start_ticks(state["jail_pid"]) != state["jail_start_ticks"]
    handle = provider.create(SandboxSpec(sandbox_id="after-close"))  # cold from now on
    try:
        assert not _was_warm(provider, handle.provider_id)
    finally:
        provider.destroy(handle.provider_id)
    assert _pool_dirs(jails) == set()


_OWNER = """
import os, sys
from pathlib import Path
from sandboxes.providers.local import LocalProvider
provider = LocalProvider(Path(sys.argv[1]), warm_pool=2)
assert provider._pool.wait_full(30)
print("full", flush=True)
if sys.stdin.readline().strip() == "crash":
    os._exit(0)  # no atexit: as if the worker were killed
"""


def _owner(root: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(  # noqa: S603 - our own interpreter and script
        [sys.executable, "-c", _OWNER, str(root)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "full"
    return proc


def test_another_live_processs_pool_is_hidden_then_reaped_when_it_dies():
    jails = jail_root("warm")
    owner = _owner(jails)
    provider = LocalProvider(root_dir=jails)
    try:
        pool = _pool_dirs(jails)
        assert len(pool) == 2
        assert provider.list_sandboxes() == []
        owner.kill()
        owner.wait(30)
        listed = {h.provider_id: h for h in provider.list_sandboxes()}
        assert set(listed) == pool  # the reconciler destroys these as orphans
        assert all(not h.labels for h in listed.values())
        for provider_id in pool:
            assert provider.destroy(provider_id)
        assert _pool_dirs(jails) == set()
        assert provider.list_sandboxes() == []
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait(30)
        for name in _pool_dirs(jails):
            provider.destroy(name)


def test_a_crashed_owners_jails_stop_waiting_for_their_configuration():
    jails = jail_root("warm")
    owner = _owner(jails)
    assert owner.stdin is not None
    owner.stdin.write("crash\n")
    owner.stdin.close()
    owner.wait(30)
    provider = LocalProvider(root_dir=jails)
    try:
        handles = provider.list_sandboxes()
        assert len(handles) == 2
        # the agent saw EOF on its configuration pipe and answers with its defaults
        assert {h.state for h in handles} == {SandboxState.RUNNING}
    finally:
        for name in _pool_dirs(jails):
            provider.destroy(name)


def test_clean_exit_destroys_the_pool():
    jails = jail_root("warm")
    owner = _owner(jails)
    assert owner.stdin is not None
    owner.stdin.write("exit\n")
    owner.stdin.close()
    assert owner.wait(30) == 0
    assert _pool_dirs(jails) == set()


def test_a_forked_child_does_not_claim_its_parents_jails(warm_provider):
    assert warm_provider._pool.wait_full(30)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        code = 1
        try:
            code = 0 if warm_provider._pool.idle_count() == 0 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert warm_provider._pool.idle_count() == 2
    sandbox = warm_provider.create(SandboxSpec(sandbox_id=uuid.uuid4().hex)).provider_id
    try:
        assert _was_warm(warm_provider, sandbox)
        assert sh(warm_provider, sandbox, "echo parent").stdout == b"parent\n"
    finally:
        warm_provider.destroy(sandbox)


def test_user_code_cannot_reach_the_configuration_pipe(warm_provider, make_warm):
    # The pipes of every idle jail, before one is claimed: after the claim, neither the
    # agent nor a command holds the claimed jail's pipe (read and closed before the first
    # command ran, never inherited). Compared by pipe inode, not by counting descriptors,
    # whose number varies with the requests the agent is serving at that moment.
    assert warm_provider._pool.wait_full(30)
    with warm_provider._pool._cond:
        pipes = {f"pipe:[{os.fstat(w.config_fd).st_ino}]" for w in warm_provider._pool._idle}
    assert pipes
    sandbox = make_warm()
    links = sh(
        warm_provider, sandbox, "for f in /proc/1/fd/* /proc/self/fd/*; do readlink $f; done"
    ).stdout.decode()
    assert "pipe:[" in links  # the command's own pipes are there: the probe sees pipes
    assert not pipes & set(links.split()), links


def test_signals_do_not_reach_the_agent_of_a_claimed_jail(warm_provider, make_warm):
    sandbox = make_warm()
    sh(warm_provider, sandbox, f"kill -9 1; kill -{int(signal.SIGTERM)} 1; kill -9 -1")
    assert sh(warm_provider, sandbox, "echo alive").stdout == b"alive\n"


class StandInSpawner:
    """Starts stand-in warm jails (no process) and records when each start began."""

    def __init__(self) -> None:
        self.started_at: list[float] = []
        # The refill may run one spawn per core at once: number them under a lock.
        self._lock = threading.Lock()

    def __call__(self) -> WarmJail:
        with self._lock:
            self.started_at.append(time.monotonic())
            return WarmJail(jail_id=f"stand-in-{len(self.started_at)}", config_fd=-1)


def test_refill_waits_for_a_quiet_moment_unless_the_pool_is_empty():  # type: ignore[no-untyped-def]
    # The pool's scheduling alone, with stand-in jails (the real ones are tested above).
    spawn = StandInSpawner()
    spawned = spawn.started_at
    pool = WarmPool(2, spawn, destroy=lambda jail_id: None)
    try:
        assert pool.claim(lambda warm: warm) is None  # empty: wakes the refill
        assert pool.wait_full(10)
        assert len(spawned) == 2
        claimed_at = time.monotonic()
        # Either of the two warm jails (parallel spawns finish in any order), never a new one.
        assert pool.claim(lambda warm: warm.jail_id) in {"stand-in-1", "stand-in-2"}
        assert pool.wait_full(10)
        # One jail was still idle, so its replacement waited for the quiet period.
        assert spawned[2] - claimed_at >= REFILL_QUIET_S
        # Two quick claims empty the pool; then the refill does not wait.
        assert pool.claim(lambda warm: warm) is not None
        assert pool.claim(lambda warm: warm) is not None
        assert pool.wait_full(10)
        assert len(spawned) == 5
    finally:
        pool.close()


def full_stand_in_pool() -> tuple[WarmPool, list[float]]:
    """A pool of four stand-in jails with one refill worker, filled; and when each of its
    spawns began."""
    spawn = StandInSpawner()
    pool = WarmPool(4, spawn, destroy=lambda jail_id: None, workers=1)
    assert pool.claim(lambda warm: warm) is None  # empty: wakes the refill
    assert pool.wait_full(10)
    assert len(spawn.started_at) == 4
    return pool, spawn.started_at


def test_refill_does_not_wait_once_the_pool_is_below_half():  # type: ignore[no-untyped-def]
    # A steady stream of creates is never quiet: waiting for quiet would drain the pool.
    pool, spawned = full_stand_in_pool()
    try:
        assert len(spawned) == 4
        # Two claims leave half the target idle: the refill still waits for quiet.
        assert pool.claim(lambda warm: warm) is not None
        assert pool.claim(lambda warm: warm) is not None
        claimed_at = time.monotonic()
        # A third leaves one of four: the refill starts without waiting for quiet.
        assert pool.claim(lambda warm: warm) is not None
        below_half_at = time.monotonic()
        assert pool.wait_full(10)
        assert len(spawned) == 7
        assert spawned[4] - below_half_at < REFILL_QUIET_S
        assert spawned[4] - claimed_at < REFILL_QUIET_S
    finally:
        pool.close()


def test_refill_holds_while_creates_arrive_together():  # type: ignore[no-untyped-def]
    pool, spawned = full_stand_in_pool()
    try:
        with pool.creating(), pool.creating():  # two creates in progress at once
            for _ in range(3):  # one of four left: below half, which alone refills at once
                assert pool.claim(lambda warm: warm) is not None
            assert not pool.wait_full(0.5)
            assert len(spawned) == 4
            with pool.creating():  # a third arrives and leaves: still together
                pass
            first_left_at = time.monotonic()
        assert pool.wait_full(10)
        assert len(spawned) == 7
        # Not before the hold after the last moment two were in progress at once.
        assert spawned[4] - first_left_at >= BURST_HOLD_S
    finally:
        pool.close()


def test_one_create_at_a_time_does_not_hold_the_refill():  # type: ignore[no-untyped-def]
    # One after another is never a burst: the pool refills while the create is in progress.
    pool, spawned = full_stand_in_pool()
    try:
        for _ in range(3):
            with pool.creating():
                assert pool.claim(lambda warm: warm) is not None
                assert pool.wait_full(10)
        assert len(spawned) == 7
    finally:
        pool.close()


def test_concurrent_creates_hold_the_providers_refill(warm_provider, monkeypatch):  # type: ignore[no-untyped-def]
    # Both claims are held in the middle of adopting their jail, so both creates are in
    # progress at once and the pool is empty: it refills only once they are done.
    assert warm_provider._pool.wait_full(30)
    release = threading.Event()
    set_limits = jail_cgroups.cgroups_set_limits

    def held(paths: dict[str, str], res: Resources) -> bool:
        if threading.current_thread() in threads:  # not the refill's own starts
            assert release.wait(30)
        return set_limits(paths, res)

    monkeypatch.setattr(jail_cgroups, "cgroups_set_limits", held)
    made: list[str] = []

    def create() -> None:
        spec = SandboxSpec(sandbox_id=uuid.uuid4().hex, resources=NOT_THE_POOLS)
        made.append(warm_provider.create(spec).provider_id)

    threads = [threading.Thread(target=create) for _ in range(2)]
    try:
        for thread in threads:
            thread.start()
        _wait(lambda: warm_provider._pool.idle_count() == 0)  # both claimed theirs
        assert not warm_provider._pool.wait_full(1.0)
    finally:
        release.set()
        for thread in threads:
            thread.join(30)
        monkeypatch.undo()
    try:
        assert len(made) == 2
        assert all(_was_warm(warm_provider, sid) for sid in made)
        assert warm_provider._pool.wait_full(30)
    finally:
        for sid in made:
            warm_provider.destroy(sid)


def test_a_create_no_warm_jail_could_serve_does_not_hold_the_refill(monkeypatch):  # type: ignore[no-untyped-def]
    # A networked create (cold by design) held in the middle of its start, with creates one
    # after another beside it: they refill the pool as a stream does, however long it takes.
    # A provider of its own: no earlier test's creates count towards its pool's hold.
    provider = LocalProvider(root_dir=jail_root("warm-beside-network"), warm_pool=2)
    made: list[str] = []
    try:
        if Capability.NETWORK not in provider.capabilities:
            missing_part("network=True needs slirp4netns and nftables")
        provider.warm_pool_start()
        assert provider._pool.wait_full(30)
        monkeypatch.setattr(warm_pool, "BURST_HOLD_S", 60.0)  # a hold would outlast the test
        started, release = threading.Event(), threading.Event()
        cgroups_create = jail_cgroups.cgroups_create

        def held(*args, **kwargs):  # type: ignore[no-untyped-def]
            if threading.current_thread() is slow:
                started.set()
                assert release.wait(30)
            return cgroups_create(*args, **kwargs)

        def networked() -> None:
            spec = SandboxSpec(sandbox_id=uuid.uuid4().hex, network=True)
            made.append(provider.create(spec).provider_id)

        monkeypatch.setattr(jail_cgroups, "cgroups_create", held)
        slow = threading.Thread(target=networked)
        slow.start()
        try:
            assert started.wait(30)
            for _ in range(2):  # empties the pool of 2
                made.append(provider.create(SandboxSpec(sandbox_id=uuid.uuid4().hex)).provider_id)
            assert provider._pool.wait_full(20)
            assert slow.is_alive()  # still in progress all along
        finally:
            release.set()
            slow.join(30)
            monkeypatch.undo()
        assert len(made) == 3
    finally:
        for sid in made:
            provider.destroy(sid)
        provider.close()


def test_a_burst_grows_the_pool_then_it_shrinks_back(monkeypatch):  # type: ignore[no-untyped-def]
    # The pool's sizing alone, with stand-in jails whose start waits for a gate.

    gate = threading.Event()
    count = iter(range(1_000_000))
    destroyed: list[str] = []

    def spawn() -> WarmJail:
        assert gate.wait(10)
        return WarmJail(jail_id=f"stand-in-{next(count)}", config_fd=-1)

    pool = WarmPool(2, spawn, destroy=destroyed.append, max_size=6)
    try:
        assert pool.claim(lambda warm: warm) is None  # the first create fills it: no miss
        assert pool.target() == 2
        for _ in range(3):  # a burst finds it empty: three creates go cold
            assert pool.claim(lambda warm: warm) is None
        assert pool.target() == 5
        for _ in range(3):
            assert pool.claim(lambda warm: warm) is None
        assert pool.target() == 6  # at most max_size
        gate.set()
        assert pool.wait_full(10)
        assert pool.idle_count() == 6
        # Quiet long enough: back to the floor, the surplus destroyed.
        monkeypatch.setattr(burst_sizing, "DECAY_S", 0.0)
        assert pool.target() == 2
        with pool._cond:
            pool._cond.notify_all()
        deadline = time.monotonic() + 10
        while pool.idle_count() > 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pool.idle_count() == 2
        assert len(destroyed) == 4
    finally:
        pool.close()


def test_creates_the_refill_keeps_up_with_do_not_grow_the_pool():  # type: ignore[no-untyped-def]
    count = iter(range(1_000_000))
    pool = WarmPool(
        2,
        lambda: WarmJail(jail_id=f"stand-in-{next(count)}", config_fd=-1),
        destroy=lambda jail_id: None,
        max_size=6,
    )
    try:
        pool.claim(lambda warm: warm)
        for _ in range(10):
            assert pool.wait_full(10)
            assert pool.claim(lambda warm: warm) is not None
        assert pool.target() == 2
    finally:
        pool.close()
