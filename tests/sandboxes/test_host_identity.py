"""As whom sandboxed code runs on the host, and what of the host kernel it can change.

A local sandbox's uid 1000 used to be host uid 0 when Sandpit ran as root: capabilities
were dropped, but every check that only compares uids passed, and /proc/sys (including
the global kernel.core_pattern, a host escape) was writable. These tests run on local
and docker alike (the `provider` fixture), plus host-side checks only local allows.
"""

from __future__ import annotations

import json
import os
import uuid
import zlib
from pathlib import Path

import pytest

from sandboxes.providers.base import ExecRequest, SandboxProvider, SandboxSpec
from sandboxes.providers.local import LocalProvider
from sandboxes.providers.local.identity import DEFAULT_UID_LOCK_DIR
from tests.requirements import jail_root, missing_part

# Walks /proc/sys and tries to open every file for writing; prints what opened.
# Opening (without writing) changes nothing, even where it succeeds.
PROC_SYS_WRITABLE = r"""
import os
opened = []
for top, dirs, files in os.walk("/proc/sys"):
    for name in files:
        path = os.path.join(top, name)
        try:
            fd = os.open(path, os.O_WRONLY)
        except OSError:
            continue
        os.close(fd)
        opened.append(path)
print("\n".join(opened))
"""

# uid_map lines are "inside outside count": the host uid that `uid` inside maps to.
OUTER_UID = r"""
import os, sys
uid = int(sys.argv[1])
for line in open("/proc/self/uid_map"):
    inside, outside, count = map(int, line.split())
    if inside <= uid < inside + count:
        print(outside + uid - inside)
"""


def _run(provider: SandboxProvider, sandbox: str, command: str, *args: str) -> str:
    result = provider.exec(sandbox, ExecRequest(command=command, args=list(args) if args else None))
    assert result.exit_code == 0, result
    return result.stdout.decode()


def _state(provider: LocalProvider, sandbox: str) -> dict:
    return json.loads((provider.root_dir / sandbox / "state.json").read_text())


def _host_uids(pid: int) -> list[int]:
    """Real, effective, saved and filesystem uids of `pid` as the host sees them."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return [int(x) for x in line.split()[1:]]
    raise AssertionError(f"no Uid line for {pid}")


def _descendants(root: int) -> set[int]:
    """`root` and every process below it, from the host's /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo.extend(children.get(pid, []))
    return found


def test_no_file_under_proc_sys_opens_for_writing(provider, sandbox):
    assert _run(provider, sandbox, "python3", "-c", PROC_SYS_WRITABLE).strip() == ""
    for path in ("/proc/sys/kernel/core_pattern", "/proc/sys/vm/swappiness"):
        result = provider.exec(sandbox, ExecRequest(command=f"cat {path} > {path}", timeout_s=10))
        assert result.exit_code != 0, path


def test_sandbox_user_is_not_host_root(provider, sandbox):
    """The uid inside, mapped to the host through the sandbox's uid_map, is not 0. On
    local, bwrap nests a second user namespace, so the map that reaches the host is
    the jail's as the host reads it; docker has no user namespace (identity map)."""
    inside = int(_run(provider, sandbox, "id", "-u"))
    assert inside != 0
    if provider.name == "local":
        jail_pid = _state(provider, sandbox)["jail_pid"]
        mapping = Path(f"/proc/{jail_pid}/uid_map").read_text().split()
        outer = [int(mapping[1]) + inside - int(mapping[0])]
    else:
        outer = [
            int(uid)
            for uid in _run(provider, sandbox, "python3", "-c", OUTER_UID, str(inside)).split()
        ]
        assert outer == [inside]
    assert outer and 0 not in outer


def test_files_the_sandbox_creates_are_not_owned_by_host_root(provider, sandbox):
    _run(provider, sandbox, "sh", "-c", "echo x > /workspace/mine && mkdir -p /workspace/d/e")
    # Python's stat, not coreutils': Debian's gVisor refuses the statx flags coreutils passes.
    owner = int(_run(provider, sandbox, "find", "/workspace/mine", "-printf", "%U"))
    outer = int(_run(provider, sandbox, "python3", "-c", OUTER_UID, str(owner)).split()[0])
    if provider.name == "local":
        host = provider.root_dir / sandbox / "workspace"
        outer = os.stat(host / "mine").st_uid
        assert os.stat(host / "d" / "e").st_uid == outer
    assert outer != 0


def test_masked_proc_files_are_empty(provider, sandbox):
    for path in ("/proc/keys", "/proc/timer_list", "/proc/kcore", "/proc/sched_debug"):
        if not os.path.exists(path):
            continue
        result = provider.exec(sandbox, ExecRequest(command=f"head -c 64 {path}"))
        assert result.stdout == b"", path


# --- local only: what the host sees ---------------------------------------------------


def _require_root() -> None:
    """Jails take host uids of their own only when Sandpit runs as root (make test does)."""
    if os.geteuid() != 0:
        missing_part("per-sandbox host uids need the tests to run as root")


@pytest.fixture
def two_local(local_provider):  # type: ignore[no-untyped-def]
    ids = [uuid.uuid4().hex, uuid.uuid4().hex]
    for sandbox_id in ids:
        local_provider.create(SandboxSpec(sandbox_id=sandbox_id))
    yield ids
    for sandbox_id in ids:
        local_provider.destroy(sandbox_id)


def test_each_local_jail_runs_as_its_own_unprivileged_host_uid(local_provider, two_local):
    _require_root()
    uids = []
    for sandbox in two_local:
        state = _state(local_provider, sandbox)
        # A command of the sandbox's, alive while we look at it from the host.
        proc = local_provider.start_process(sandbox, "sleep", ["30"])
        try:
            pids = _descendants(state["jail_pid"])
            assert len(pids) >= 2  # the agent and the sleep, at least
            for pid in pids:
                host = set(_host_uids(pid))
                assert host == {state["host_uid"]}, (pid, host)
            # The host's view of the jail's uid_map: uid 1000 is that unprivileged uid.
            mapping = Path(f"/proc/{state['jail_pid']}/uid_map").read_text().split()
            assert mapping == ["1000", str(state["host_uid"]), "1"]
        finally:
            local_provider.signal_process(sandbox, proc.pid, 9)
        uids.append(state["host_uid"])
    assert 0 not in uids
    assert uids[0] != uids[1]
    # API writes land as the jail's uid too, so the sandbox can change them.
    sandbox = two_local[0]
    local_provider.write_file(sandbox, "api/written.txt", b"from the api\n")
    host = local_provider.root_dir / sandbox / "workspace"
    assert os.stat(host / "api").st_uid == uids[0]
    assert os.stat(host / "api" / "written.txt").st_uid == uids[0]
    _run(local_provider, sandbox, "sh", "-c", "echo more >> api/written.txt && rm -r api")


def test_a_destroyed_jails_uid_is_given_back(local_provider):
    _require_root()
    sandbox = uuid.uuid4().hex
    local_provider.create(SandboxSpec(sandbox_id=sandbox))
    uid = _state(local_provider, sandbox)["host_uid"]
    lock = Path(DEFAULT_UID_LOCK_DIR) / str(uid)
    assert lock.exists()
    local_provider.destroy(sandbox)
    assert not lock.exists()


def test_providers_with_different_roots_never_share_a_host_uid(local_provider):
    """The uid locks are the host's, not a root's: two providers (other roots, the same
    sandbox id, so the same first uid to try) give their jails two different host uids, so
    neither jail can signal or trace the other's processes."""
    _require_root()
    other = LocalProvider(root_dir=jail_root("local-sandboxes-other-root"))
    sandbox = uuid.uuid4().hex
    local_provider.create(SandboxSpec(sandbox_id=sandbox))
    try:
        other.create(SandboxSpec(sandbox_id=sandbox))
        try:
            first = _state(local_provider, sandbox)["host_uid"]
            second = _state(other, sandbox)["host_uid"]
            assert first != second
            assert (Path(DEFAULT_UID_LOCK_DIR) / str(second)).exists()
        finally:
            other.destroy(sandbox)
    finally:
        local_provider.destroy(sandbox)


def test_uids_an_earlier_version_locked_under_the_root_stay_taken(tmp_path):  # type: ignore[no-untyped-def]
    """An upgrade with live jails: their uids were locked under the provider root; the host-wide
    directory takes them over, so a new jail never gets a uid a live one runs as."""
    _require_root()
    root = Path(jail_root("local-sandboxes-upgrade"))
    old = root / ".sandpit" / "uids"
    old.mkdir(parents=True, exist_ok=True)
    sandbox = uuid.uuid4().hex
    first_try = 1_000_000_000 + zlib.crc32(sandbox.encode()) % 65_536
    (old / str(first_try)).write_text("a jail of the earlier version")
    lock_dir = tmp_path / "uids"
    provider = LocalProvider(root_dir=root, host_uid_lock_dir=lock_dir)
    assert not old.exists()
    assert (lock_dir / str(first_try)).read_text() == "a jail of the earlier version"
    provider.create(SandboxSpec(sandbox_id=sandbox))
    try:
        assert _state(provider, sandbox)["host_uid"] not in (0, first_try)
    finally:
        provider.destroy(sandbox)


def test_jail_directories_are_private_to_the_host_and_the_jail(local_provider, two_local):
    sandbox = two_local[0]
    sdir = local_provider.root_dir / sandbox
    assert os.stat(sdir).st_mode & 0o777 == 0o711  # passable, not listable
    for name in ("state.json", "jail.log"):
        assert os.stat(sdir / name).st_mode & 0o077 == 0, name
