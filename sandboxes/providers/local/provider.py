"""LocalProvider: sandboxes as long-lived bubblewrap jails on this host.

Each sandbox is one bwrap jail whose PID 1 is the in-sandbox agent (sandboxes/agent/)
listening on a Unix socket in ``root_dir/<id>/run``. Commands, background
processes, terminals and port streams go through the agent; file operations
and watches run host-side on the workspace directory (see files.py), which is
faster and works even when the jail has died.

Every jail has its own network namespace; network=True attaches slirp4netns
and a firewall to it (net.py). Everything a jail can write sits on a tmpfs of
``resources.disk_mb`` when Sandpit may mount one (volume.py).

With ``warm_pool=N`` the provider keeps N idle jails started (from its first create on) and `create`
claims one of them when the sandbox needs no network (pool.py).

This module holds the lifecycle (create, get, list, destroy, stats, health); starting a
jail is boot.py's, and what runs inside one (commands, files, processes, terminals,
ports) is operations.py's.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from sandboxes.providers.agent_operations import check_env
from sandboxes.providers.base import (
    Capability,
    CapabilityNotSupported,
    InvalidRequest,
    ProviderError,
    ProviderHealth,
    SandboxGone,
    SandboxHandle,
    SandboxSpec,
    SandboxState,
    SandboxStats,
)
from sandboxes.providers.local import c_helpers, jail, jail_cgroups, launcher, net, volume
from sandboxes.providers.local.boot import (
    BWRAP_INSTALL_HINT,
    JailBoot,
    check_passable,
    read_uid_file,
)
from sandboxes.providers.local.etc import JailEtc
from sandboxes.providers.local.files import Workspace
from sandboxes.providers.local.identity import DEFAULT_UID_LOCK_DIR, HostIdentities
from sandboxes.providers.local.operations import JailOperations
from sandboxes.providers.local.pool import WarmJail, WarmPool, owner_alive
from sandboxes.providers.local.snapshot import (
    LocalSnapshots,
    cgroups_thaw,
    jail_frozen,
)

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


LAUNCH_APART = "jail_launch"
EXEC_SHIM = "exec shim"
"""Named in health's detail when jails start through launcher.py's helper."""


class LocalProvider(JailBoot, JailOperations, LocalSnapshots):
    """Sandboxes as bubblewrap jails under `root_dir`, limited by cgroups (v1 or v2) where
    the host gives Sandpit them.

    `warm_pool` is how many idle jails to keep started for `create` to claim (0: none), and
    `warm_pool_max` how many it may grow to after a burst (pool.py); call `close()` to
    destroy them before dropping a provider that has some. When Sandpit
    runs as root, each jail runs as its own host uid from ``host_uid_base`` on
    (``host_uid_count`` of them; see identity.py). `cgroup_version` picks the cgroup
    hierarchy: "auto", "v1" or "v2" (jail_cgroups.cgroup_bases).
    """

    name = "local"
    capabilities: frozenset[Capability] = frozenset(Capability)

    def __init__(
        self,
        root_dir: Path,
        bwrap_path: str = "bwrap",
        max_file_bytes: int = 50 * 1024 * 1024,
        warm_pool: int = 0,
        host_uid_base: int = 1_000_000_000,
        host_uid_count: int = 65_536,
        host_uid_lock_dir: str | Path = DEFAULT_UID_LOCK_DIR,
        create_concurrency: int = 0,
        warm_pool_max: int = 0,
        launch_apart: bool = True,
        root_in_memory: bool = False,
        cgroup_version: str = "auto",
    ) -> None:
        self.root_dir = Path(root_dir)
        self.bwrap_path = bwrap_path
        self.max_file_bytes = max_file_bytes
        self.root_dir.mkdir(parents=True, exist_ok=True)
        # Before anything is written under it: only an empty root is mounted over.
        self.root_in_memory = root_in_memory and volume.root_in_memory(self.root_dir)
        # Jail uids may pass through (not list) the root to reach their own directory.
        os.chmod(self.root_dir, 0o711)  # noqa: S103 - passable by jail uids, not listable
        shared = self.root_dir / ".sandpit"
        shared.mkdir(exist_ok=True)
        os.chmod(shared, 0o711)  # noqa: S103 - passable by jail uids, not listable
        self._shared_etc = shared / "etc"
        jail.write_shared_etc(self._shared_etc)
        os.chmod(self._shared_etc, 0o755)  # noqa: S103 - files every jail reads
        self._etc = JailEtc(shared, jail.ETC_FILES, jail.GENERATED_ETC, jail.NETWORK_ETC)
        self._etc.remove_unused(self._etc_dirs_in_use())
        self._agent_path = shared / "agent.pyz"
        jail.install_agent(self._agent_path)
        self._exec_shim = c_helpers.build_exec_shim(shared)
        # One lock directory for the whole host, not per root: two providers with different
        # roots must never hand the same host uid to two live jails.
        self._identities = HostIdentities(Path(host_uid_lock_dir), host_uid_base, host_uid_count)
        # Jails started by an earlier version recorded their uids under the root: carry
        # those locks over, so no new jail takes a uid a live one still runs as.
        self._identities.adopt(shared / "uids")
        if self._identities.switching:
            check_passable(self.root_dir)
        self._cgroup_bases = jail_cgroups.cgroup_bases(
            jail_cgroups.cgroup_scope(self.root_dir), cgroup_version
        )
        self._net_tools = net.find_tools()
        if self._net_tools is None:
            self.capabilities = frozenset(Capability) - {Capability.NETWORK}
        self._disk_quota = volume.supported(self.root_dir / ".sandpit" / "probe")
        # Only the volumes make the host's mount table grow with the sandboxes. Off
        # (launch_apart=False) only to measure what it saves (bench/bench_local_provider.py).
        self._launcher = launcher.build(shared) if self._disk_quota and launch_apart else None
        self._bwraps: dict[str, subprocess.Popen[bytes]] = {}
        self._cpu_samples: dict[str, tuple[float, int]] = {}
        self._lock = threading.Lock()
        self._pool = (
            WarmPool(int(warm_pool), self._spawn_warm, self.destroy, max_size=warm_pool_max)
            if warm_pool > 0
            else None
        )
        # Cold starts at once (0: no limit). A start is CPU-bound (bwrap, the agent's Python):
        # 100 started together all finish near the end, past CREATE_TIMEOUT_S on a loaded
        # host; queued, the first are ready early (the wait is not part of the timeout).
        self._cold_starts: threading.Semaphore | contextlib.nullcontext[None] = (
            threading.Semaphore(create_concurrency)
            if create_concurrency > 0
            else contextlib.nullcontext()
        )

    def warm_pool_start(self) -> None:
        """Start filling the warm pool now rather than at the first create."""
        if self._pool is not None:
            self._pool.start()

    def close(self) -> None:
        """Destroy the unclaimed warm jails and stop refilling (also done at exit); remove
        this root's cgroup parents if no jail is left in them."""
        if self._pool is not None:
            self._pool.close()
        jail_cgroups.cgroup_scope_remove(self._cgroup_bases)

    def _etc_dirs_in_use(self) -> set[str]:
        """The /etc directory of every jail under root_dir (see etc.py)."""
        used = set()
        for entry in os.listdir(self.root_dir):
            if not entry.startswith("."):
                state = jail.JailState.load(self.root_dir / entry / "state.json")
                if state is not None and state.etc_dir:
                    used.add(state.etc_dir)
        return used

    # ------------------------------------------------------------------ paths

    def _dir(self, provider_id: str) -> Path:
        if not isinstance(provider_id, str) or not _ID_RE.match(provider_id):
            raise SandboxGone(f"no sandbox {provider_id!r}")
        return self.root_dir / provider_id

    def _state(self, provider_id: str) -> tuple[Path, jail.JailState]:
        path = self._dir(provider_id)
        state = jail.JailState.load(path / "state.json")
        if state is None:
            raise SandboxGone(f"no sandbox {provider_id!r}")
        return path, state

    def _workspace(self, provider_id: str) -> Workspace:
        sandbox_dir = self._dir(provider_id)
        return Workspace(
            volume.subdir(sandbox_dir, "workspace"),
            self.max_file_bytes,
            chown_to_owner=self._identities.switching,
            tmp=volume.subdir(sandbox_dir, "tmp"),  # the jail's /tmp (jail.py binds it there)
        )

    # -------------------------------------------------------------- lifecycle

    def create(self, spec: SandboxSpec) -> SandboxHandle:
        """Start the jail and return once its agent accepts connections (~25 ms; ~1 ms
        when a warm jail is claimed)."""
        return self._create(spec, None)

    def warm_reserve(self, spec: SandboxSpec) -> LocalWarmReservation | None:
        """An idle warm jail set aside for `spec` (see WarmReserving), or None when the pool
        has none or `spec` cannot take one (or is invalid: `create` says why)."""
        if self._pool is None or not self._warm_fits(spec) or not _ID_RE.match(spec.sandbox_id):
            return None
        try:
            check_env({str(k): str(v) for k, v in spec.env.items()})
        except InvalidRequest:
            return None
        warm = self._pool.take()
        if warm is None:
            return None
        # The sandbox's directory now, before its row exists: a destroy from then on
        # finds it, and removing it keeps the jail from being adopted (_adopt).
        sdir = self.root_dir / spec.sandbox_id
        try:
            sdir.mkdir(mode=0o700)
        except OSError:  # taken, or the root refuses: `create` says why
            self._pool.give_back(warm)
            return None
        pool = self._pool

        def give_back(unused: WarmJail) -> None:
            pool.give_back(unused)
            with contextlib.suppress(OSError):
                sdir.rmdir()

        return LocalWarmReservation(
            spec.sandbox_id,
            warm,
            adopt=lambda taken: self._create(spec, taken, reserved=True),
            give_back=give_back,
        )

    def _warm_fits(self, spec: SandboxSpec) -> bool:
        # Warm jails run on the host's /usr: a template's root needs a jail of its own.
        return not spec.network and not spec.rootfs and not spec.restore_from

    def _create(
        self, spec: SandboxSpec, taken: WarmJail | None, *, reserved: bool = False
    ) -> SandboxHandle:
        """create(), on `taken` (a warm jail set aside for it) when there is one; `reserved`:
        warm_reserve made the sandbox's directory, and a destroy may have removed it since."""
        try:
            if not _ID_RE.match(spec.sandbox_id):
                raise InvalidRequest("sandbox_id must be 1-64 letters, digits, '-' or '_'")
            env = {str(k): str(v) for k, v in spec.env.items()}
            check_env(env)
            if spec.network and self._net_tools is None:
                raise CapabilityNotSupported(
                    "network=True needs slirp4netns, nsenter and nft on the host "
                    "(apt-get install slirp4netns nftables); without them the local provider "
                    "refuses rather than share the host's network"
                )
            sdir = self.root_dir / spec.sandbox_id
            if not reserved:
                try:
                    sdir.mkdir(mode=0o700)
                except FileExistsError:
                    raise InvalidRequest(f"sandbox {spec.sandbox_id} already exists") from None
        except BaseException:
            if taken is not None and self._pool is not None:
                self._pool.give_back(taken)
            raise
        # Only the creates a warm jail could serve tell the pool of a burst: a restore or a
        # template's jail may take seconds, and a stream of creates beside it should refill.
        if self._pool is not None and self._warm_fits(spec):
            with self._pool.creating():
                handle = self._pool.claim(
                    lambda warm: self._adopt(warm, spec, sdir, env), taken=taken
                )
                return handle if handle is not None else self._start_cold(spec, sdir, env)
        return self._start_cold(spec, sdir, env)

    def _start_cold(self, spec: SandboxSpec, sdir: Path, env: dict[str, str]) -> SandboxHandle:
        try:
            with self._cold_starts:
                return self._start(spec, sdir, env)
        except BaseException:
            self._teardown(spec.sandbox_id, sdir, None)
            raise

    def _handle(
        self, provider_id: str, *, ping: bool, state: jail.JailState | None = None
    ) -> SandboxHandle:
        if state is None:
            _, state = self._state(provider_id)
        running = jail.jail_alive(state)
        if running and ping and not jail_frozen(state):  # a paused agent cannot answer
            try:
                self._call(provider_id, {"op": "ping"}, timeout=2.0)
            except ProviderError:
                running = False
        return SandboxHandle(
            provider=self.name,
            provider_id=provider_id,
            state=SandboxState.RUNNING if running else SandboxState.STOPPED,
            created_at=datetime.fromtimestamp(state.created_at, tz=UTC),
            labels=state.labels,
        )

    def get(self, provider_id: str) -> SandboxHandle:
        """RUNNING when the jail is alive and its agent answers; raises SandboxGone."""
        return self._handle(provider_id, ping=True)

    def list_sandboxes(self) -> list[SandboxHandle]:
        """Every sandbox directory under root_dir, including ones whose jail died, and
        the unclaimed warm jails of processes that died (never those of a live one)."""
        out = []
        for entry in sorted(os.listdir(self.root_dir)):
            if entry.startswith(".") or not _ID_RE.match(entry):
                continue
            state = jail.JailState.load(self.root_dir / entry / "state.json")
            # Another process's (or our own) idle warm jail, possibly still starting.
            idle_warm = jail.pool_owner_alive(state) if state else owner_alive(entry)
            if idle_warm:
                continue
            try:
                if state is None:
                    raise SandboxGone(entry)
                out.append(self._handle(entry, ping=True, state=state))
            except SandboxGone:
                try:
                    created = (self.root_dir / entry).stat().st_mtime
                except FileNotFoundError:  # destroyed (or claimed) meanwhile
                    continue
                out.append(
                    SandboxHandle(
                        provider=self.name,
                        provider_id=entry,
                        state=SandboxState.ERROR,
                        created_at=datetime.fromtimestamp(created, tz=UTC),
                    )
                )
        return out

    def destroy(self, provider_id: str) -> bool:
        """Kill the jail's processes, remove its cgroups and directory. False if already gone."""
        sdir = self._dir(provider_id)
        if not sdir.exists():
            return False
        state = jail.JailState.load(sdir / "state.json")
        self._teardown(provider_id, sdir, state)
        return True

    def _teardown(self, provider_id: str, sdir: Path, state: jail.JailState | None) -> None:
        if state is not None:
            jail.kill_if_same(state.jail_pid, state.jail_start_ticks)
            jail.kill_if_same(state.slirp_pid, state.slirp_start_ticks)
            cgroups_thaw(state.cgroups)  # a paused jail's tasks die only once thawed
        with self._lock:
            proc = self._bwraps.pop(provider_id, None)
        if proc is not None:
            if state is None:
                proc.kill()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
        cgroups = (
            state.cgroups
            if state is not None
            else {ctrl: f"{base}/{provider_id}" for ctrl, base in self._cgroup_bases.items()}
        )
        emptied = jail_cgroups.cgroups_remove(cgroups)
        self._cpu_samples.pop(provider_id, None)
        volume.remove(sdir)
        host_uid = read_uid_file(sdir)
        shutil.rmtree(sdir, ignore_errors=True)
        # Only once nothing runs as the jail's uid may another jail take it; a uid whose
        # processes outlived the kill stays reserved (a leak of one uid, never a share).
        if host_uid is not None and emptied:
            self._identities.release(host_uid)

    def set_timeout(self, provider_id: str, timeout_s: int) -> None:
        """Record the remaining lifetime (local has no kill timer; the reaper ends it)."""
        sdir, state = self._state(provider_id)
        state.timeout_s = int(timeout_s)
        state.save(sdir / "state.json")

    def stats(self, provider_id: str) -> SandboxStats:
        """Memory and CPU from the sandbox's cgroups, disk from a walk of workspace and tmp."""
        sdir, state = self._state(provider_id)
        now = time.time()
        uptime = max(0.0, now - state.created_at)
        cpu_percent = 0.0
        process_count = 0
        cg = state.cgroups
        memory = jail_cgroups.cgroup_memory_bytes(cg)
        cpu_ns = jail_cgroups.cgroup_cpu_ns(cg)
        if cpu_ns is not None:
            usage = max(0, cpu_ns - state.cpu_base_ns)
            mono = time.monotonic()
            prev = self._cpu_samples.get(provider_id)
            self._cpu_samples[provider_id] = (mono, usage)
            if prev is not None and mono - prev[0] < 60 and mono > prev[0]:
                cpu_percent = (usage - prev[1]) / 1e9 / (mono - prev[0]) * 100
            elif uptime > 0:
                cpu_percent = usage / 1e9 / uptime * 100
        procs = cg.get("pids") or cg.get(jail_cgroups.UNIFIED)
        if procs is not None:  # neither the agent nor slirp4netns counts
            pids = [p for p in jail_cgroups.cgroup_pids(procs) if p != state.slirp_pid]
            process_count = max(0, len(pids) - 1)
        rx = tx = 0
        if jail.jail_alive(state):
            rx, tx = _net_bytes(state.jail_pid)
        disk = volume.used_bytes(sdir)
        if disk is None:
            disk = _disk_usage(sdir / "workspace") + _disk_usage(sdir / "tmp")
        return SandboxStats(
            cpu_percent=round(max(0.0, cpu_percent), 2),
            memory_bytes=memory,
            disk_bytes=disk,
            net_rx_bytes=rx,
            net_tx_bytes=tx,
            uptime_s=uptime,
            process_count=process_count,
        )

    def health(self) -> ProviderHealth:
        """Spawns a trivial jail to prove bwrap works; detail names the limits in force."""
        started = time.perf_counter()
        bwrap = shutil.which(self.bwrap_path)
        if bwrap is None:
            return ProviderHealth(False, f"{self.bwrap_path} not found. {BWRAP_INSTALL_HINT}", 0.0)
        try:
            result = subprocess.run(
                [
                    bwrap,
                    "--unshare-all",
                    "--unshare-user",
                    "--ro-bind",
                    "/usr",
                    "/usr",
                    "--symlink",
                    "usr/lib64",
                    "/lib64",
                    "--symlink",
                    "usr/lib",
                    "/lib",
                    "/usr/bin/true",
                ],
                capture_output=True,
                timeout=10,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return ProviderHealth(False, f"bwrap failed: {exc}", _ms(started))
        if result.returncode != 0:
            detail = result.stderr.decode(errors="replace").strip()[:300]
            return ProviderHealth(False, f"bwrap failed: {detail}", _ms(started))
        limits = cgroup_limits_detail(self._cgroup_bases)
        disk = (
            "workspace quota: tmpfs of disk_mb"
            if self._disk_quota
            else "no workspace quota (cannot mount tmpfs; per-file limit only)"
        )
        network = (
            "network: slirp4netns"
            if self._net_tools is not None
            else "network: unavailable (install slirp4netns and nftables)"
        )
        launch = (
            f"jails start apart from other volumes ({LAUNCH_APART})"
            if self._launcher is not None
            else "jails start beside every volume (no jail_launch: not root, or no C compiler)"
        )
        shim = (
            f"commands start through the {EXEC_SHIM}"
            if self._exec_shim is not None
            else f"no {EXEC_SHIM} (no C compiler or static libc): agents load ctypes"
        )
        return ProviderHealth(
            True, f"bwrap ok; {limits}; {disk}; {network}; {launch}; {shim}", _ms(started)
        )


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def _net_bytes(pid: int) -> tuple[int, int]:
    text = jail.read_text(f"/proc/{pid}/net/dev") or ""
    rx = tx = 0
    for line in text.splitlines()[2:]:
        name, _, rest = line.partition(":")
        if name.strip() == "lo":
            continue
        fields = rest.split()
        if len(fields) >= 9:
            rx += int(fields[0])
            tx += int(fields[8])
    return rx, tx


def _disk_usage(root: Path) -> int:
    """Bytes allocated under `root`, walked by O_NOFOLLOW descriptors (never leaves it)."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return 0
    return _disk_usage_fd(fd, depth=0)


def _disk_usage_fd(fd: int, depth: int) -> int:
    total = 0
    subdirs = []
    try:
        with os.scandir(fd) as it:
            for entry in it:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += st.st_blocks * 512
                if entry.is_dir(follow_symlinks=False) and depth < 64:
                    subdirs.append(entry.name)
        for name in subdirs:
            try:
                sub = os.open(
                    name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
                )
            except OSError:
                continue
            total += _disk_usage_fd(sub, depth + 1)
    finally:
        os.close(fd)
    return total


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000


class LocalWarmReservation:
    """A warm jail LocalProvider.warm_reserve set aside for one create (see WarmReservation):
    adopted under the sandbox's id (`adopt`: the provider's create on it), or handed back to
    the pool unchanged (`give_back`). Either happens once."""

    engine = ""

    def __init__(
        self,
        provider_id: str,
        warm: WarmJail,
        *,
        adopt: Callable[[WarmJail], SandboxHandle],
        give_back: Callable[[WarmJail], None],
    ) -> None:
        self.provider_id = provider_id
        self._warm: WarmJail | None = warm
        self._adopt_jail = adopt
        self._give_back = give_back

    def adopt(self) -> SandboxHandle:
        warm, self._warm = self._warm, None
        if warm is None:
            raise RuntimeError("this reservation was already adopted or released")
        return self._adopt_jail(warm)

    def release(self) -> None:
        warm, self._warm = self._warm, None
        if warm is not None:
            self._give_back(warm)


def cgroup_limits_detail(bases: dict[str, str]) -> str:
    """What health says of the limits a jail gets: its cgroup version and controllers, and
    the rlimits that stand in for missing ones."""
    if not bases:
        return (
            "cgroups unavailable: per-process rlimits only (RLIMIT_AS; RLIMIT_NPROC for a "
            "jail with its own host uid)"
        )
    version = "v2" if jail_cgroups.UNIFIED in bases else "v1"
    controllers = ",".join(sorted(set(bases) - {jail_cgroups.UNIFIED}))
    missing = [ctrl for ctrl in ("memory", "pids") if ctrl not in bases]
    if not missing:
        return f"cgroup {version} limits: {controllers}"
    stand_ins = {"memory": "RLIMIT_AS", "pids": "RLIMIT_NPROC"}
    return (
        f"cgroup {version} limits: {controllers}; no {' or '.join(missing)} controller for "
        f"Sandpit's cgroup, so per-process {', '.join(stand_ins[m] for m in missing)} instead"
    )
