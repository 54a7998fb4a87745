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
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TypedDict

from sandboxes.providers import agent_client as wire
from sandboxes.providers.agent_client import (
    AgentExecStream,
    AgentPortStream,
    AgentPtySession,
    AgentRelayPtySession,
)
from sandboxes.providers.base import (
    Capability,
    CapabilityNotSupported,
    ExecRequest,
    ExecResult,
    FileEntry,
    FileEvent,
    InvalidRequest,
    OpenPort,
    ProcessInfo,
    ProviderError,
    ProviderHealth,
    ProviderUnavailable,
    SandboxGone,
    SandboxHandle,
    SandboxSpec,
    SandboxState,
    SandboxStats,
)
from sandboxes.providers.local import jail, net, rootfs, volume
from sandboxes.providers.local.files import JAIL_WORKSPACE, Workspace
from sandboxes.providers.local.identity import HostIdentities
from sandboxes.providers.local.pool import WarmJail, WarmPool, owner_alive, pool_name
from sandboxes.providers.local.reaper import REAPER
from sandboxes.providers.local.snapshot import (
    LocalSnapshots,
    cgroups_thaw,
    jail_frozen,
    restore_files,
)
from sandboxes.providers.local.watch import WorkspaceWatch

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
CREATE_TIMEOUT_S = 10.0
CONTROL_TIMEOUT_S = 10.0


BWRAP_INSTALL_HINT = (
    "The local provider needs bubblewrap: install it with `apt-get install bubblewrap` "
    "(Debian/Ubuntu) or `make run`, which installs it when run as root."
)


class LocalProvider(LocalSnapshots):
    """Sandboxes as bubblewrap jails under `root_dir`, limited by cgroup v1 when available.

    `warm_pool` is how many idle jails to keep started for `create` to claim (0: none);
    call `close()` to destroy them before dropping a provider that has some. When Sandpit
    runs as root, each jail runs as its own host uid from ``host_uid_base`` on
    (``host_uid_count`` of them; see identity.py).
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
        create_concurrency: int = 0,
    ) -> None:
        self.root_dir = Path(root_dir)
        self.bwrap_path = bwrap_path
        self.max_file_bytes = max_file_bytes
        self.root_dir.mkdir(parents=True, exist_ok=True)
        # Jail uids may pass through (not list) the root to reach their own directory.
        os.chmod(self.root_dir, 0o711)  # noqa: S103 - passable by jail uids, not listable
        shared = self.root_dir / ".sandpit"
        shared.mkdir(exist_ok=True)
        os.chmod(shared, 0o711)  # noqa: S103 - passable by jail uids, not listable
        self._shared_etc = shared / "etc"
        jail.write_shared_etc(self._shared_etc)
        os.chmod(self._shared_etc, 0o755)  # noqa: S103 - files every jail reads
        self._agent_path = shared / "agent.pyz"
        jail.install_agent(self._agent_path)
        self._identities = HostIdentities(shared / "uids", host_uid_base, host_uid_count)
        if self._identities.switching:
            _check_passable(self.root_dir)
        self._cgroup_bases = jail.cgroup_bases()
        self._net_tools = net.find_tools()
        if self._net_tools is None:
            self.capabilities = frozenset(Capability) - {Capability.NETWORK}
        self._disk_quota = volume.supported(self.root_dir / ".sandpit" / "probe")
        self._bwraps: dict[str, subprocess.Popen[bytes]] = {}
        self._cpu_samples: dict[str, tuple[float, int]] = {}
        self._lock = threading.Lock()
        self._pool = (
            WarmPool(int(warm_pool), self._spawn_warm, self.destroy) if warm_pool > 0 else None
        )
        # Cold starts at once (0: no limit). A start is CPU-bound (bwrap, the agent's Python):
        # 100 started together all finish near the end, past CREATE_TIMEOUT_S on a loaded
        # host; queued, the first are ready early (the wait is not part of the timeout).
        self._cold_starts: threading.Semaphore | contextlib.nullcontext[None] = (
            threading.Semaphore(create_concurrency)
            if create_concurrency > 0
            else contextlib.nullcontext()
        )

    def close(self) -> None:
        """Destroy the unclaimed warm jails and stop refilling (also done at exit)."""
        if self._pool is not None:
            self._pool.close()

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
            sandbox_dir / "workspace",
            self.max_file_bytes,
            chown_to_owner=self._identities.switching,
            tmp=sandbox_dir / "tmp",  # the jail's /tmp (jail.py binds it there)
        )

    # -------------------------------------------------------------- lifecycle

    def create(self, spec: SandboxSpec) -> SandboxHandle:
        """Start the jail and return once its agent accepts connections (~25 ms; ~1 ms
        when a warm jail is claimed)."""
        if not _ID_RE.match(spec.sandbox_id):
            raise InvalidRequest("sandbox_id must be 1-64 letters, digits, '-' or '_'")
        env = {str(k): str(v) for k, v in spec.env.items()}
        _check_env(env)
        if spec.network and self._net_tools is None:
            raise CapabilityNotSupported(
                "network=True needs slirp4netns, nsenter and nft on the host "
                "(apt-get install slirp4netns nftables); without them the local provider "
                "refuses rather than share the host's network"
            )
        sdir = self.root_dir / spec.sandbox_id
        try:
            sdir.mkdir(mode=0o700)
        except FileExistsError:
            raise InvalidRequest(f"sandbox {spec.sandbox_id} already exists") from None
        # Warm jails run on the host's /usr: a template's root needs a jail of its own.
        if (
            self._pool is not None
            and not spec.network
            and not spec.rootfs
            and not spec.restore_from
        ):
            handle = self._pool.claim(lambda warm: self._adopt(warm, spec, sdir, env))
            if handle is not None:
                return handle
        try:
            with self._cold_starts:
                return self._start(spec, sdir, env)
        except BaseException:
            self._teardown(spec.sandbox_id, sdir, None)
            raise

    def _spawn_warm(self) -> WarmJail:
        """Start a warm jail for the pool: default resources, no sandbox environment, and
        a configuration pipe whose write end stays with us (see pool.py)."""
        me = os.getpid()
        jail_id = pool_name(me, jail.start_ticks(me) or 0)
        sdir = self.root_dir / jail_id
        sdir.mkdir(mode=0o700)
        config_r, config_w = os.pipe()
        try:
            self._start(SandboxSpec(sandbox_id=jail_id), sdir, {}, config_fd=config_r)
        except BaseException:
            os.close(config_w)
            self._teardown(jail_id, sdir, None)
            raise
        finally:
            os.close(config_r)
        return WarmJail(jail_id, config_w)

    def _adopt(
        self, warm: WarmJail, spec: SandboxSpec, sdir: Path, env: dict[str, str]
    ) -> SandboxHandle:
        """Turn `warm` into sandbox `spec`, whose empty directory `sdir` is reserved.
        On failure `sdir` is left empty again and the caller destroys the warm jail."""
        jail_id = warm.jail_id
        wdir = self.root_dir / jail_id
        state = jail.JailState.load(wdir / "state.json")
        if state is None or not jail.jail_alive(state):
            raise ProviderUnavailable(f"warm jail {jail_id} is gone")
        res = spec.resources
        if self._disk_quota:
            volume.resize(wdir, res.disk_mb)
        if not jail.cgroups_set_limits(state.cgroups, res):
            raise ProviderUnavailable(f"cannot apply the limits to warm jail {jail_id}")
        jail.cgroups_set_background(state.cgroups, False)
        jail.cgroups_reset_counters(state.cgroups)
        rlimits = jail.rlimits(res, with_cgroup_memory="memory" in state.cgroups)
        config = json.dumps({"env": env, "rlimits": rlimits}).encode()
        try:  # the agent reads it when the first request arrives, so it must fit the pipe
            os.set_blocking(warm.config_fd, False)
            written = os.write(warm.config_fd, config)
        except BlockingIOError:
            written = 0
        finally:
            warm.close_config()
        if written != len(config):
            raise ProviderError("the sandbox environment is too large for a warm jail")
        # Replaces the empty directory create() reserved. Mounts below wdir move along;
        # the jail sees its own copies of them, so nothing inside notices.
        os.rename(wdir, sdir)
        with self._lock:
            proc = self._bwraps.pop(jail_id, None)
            if proc is not None:
                self._bwraps[spec.sandbox_id] = proc
        created = time.time()
        state.sandbox_id = spec.sandbox_id
        state.created_at = created
        state.timeout_s = spec.timeout_s
        state.labels = dict(spec.labels)
        state.resources = dict(res.__dict__)
        state.pool_owner_pid = state.pool_owner_ticks = 0
        try:
            state.save(sdir / "state.json")
        except BaseException:
            self._teardown(spec.sandbox_id, sdir, state)
            sdir.mkdir(mode=0o700, exist_ok=True)
            raise
        return SandboxHandle(
            provider=self.name,
            provider_id=spec.sandbox_id,
            state=SandboxState.RUNNING,
            created_at=datetime.fromtimestamp(created, tz=UTC),
            labels=dict(spec.labels),
        )

    def _start(
        self,
        spec: SandboxSpec,
        sdir: Path,
        env: dict[str, str],
        *,
        config_fd: int | None = None,
    ) -> SandboxHandle:
        """Start a jail for `spec` in `sdir`. With `config_fd` it is a warm jail: its
        agent takes its configuration from that pipe (see pool.py)."""
        warm = config_fd is not None
        res = spec.resources
        host_uid = self._identities.acquire(spec.sandbox_id)
        try:
            _own_uid_file(sdir, host_uid)
        except BaseException:
            self._identities.release(host_uid)
            raise
        if self._disk_quota:
            try:
                volume.create(sdir, res.disk_mb)
            except OSError as exc:
                raise ProviderUnavailable(
                    f"cannot mount the sandbox's file system: {exc}"
                ) from None
        else:
            for sub in volume.SUBDIRS:
                (sdir / sub).mkdir(mode=0o755)
        _hand_over_dirs(sdir, host_uid)
        if spec.restore_from:  # before anything of the sandbox runs (snapshot.py)
            restore_files(self.bwrap_path, spec.restore_from, sdir, host_uid)
        cgroups = jail.cgroups_create(self._cgroup_bases, spec.sandbox_id, res)
        if warm:  # let it start without slowing the sandboxes in use
            jail.cgroups_set_background(cgroups, True)
        info_r, info_w = os.pipe()
        block_r, block_w = os.pipe()
        ready_r, ready_w = os.pipe()
        config = {
            "socket": jail.JAIL_SOCKET,
            "ready_fd": ready_w,
            "rlimits": jail.rlimits(res, with_cgroup_memory="memory" in cgroups),
            "config_fd": config_fd,
        }
        argv = jail.bwrap_argv(
            bwrap=self.bwrap_path,
            sandbox_dir=sdir,
            shared_etc=self._shared_etc,
            agent_path=self._agent_path,
            network=spec.network,
            env=jail.base_env(env),
            info_fd=info_w,
            block_fd=block_r,
            agent_config=config,
            rootfs=rootfs.rootfs_check(spec.rootfs) if spec.rootfs else None,
        )
        log = os.fdopen(  # noqa: SIM115 - handed to the child
            os.open(
                sdir / "jail.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600
            ),
            "ab",
        )
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                pass_fds=(info_w, block_r, ready_w, *((config_fd,) if warm else ())),
                start_new_session=True,
                **_run_as(host_uid),
            )
        except OSError as exc:
            raise ProviderUnavailable(
                f"cannot run {self.bwrap_path}: {exc}. {BWRAP_INSTALL_HINT}"
            ) from None
        finally:
            log.close()
            for fd in (info_w, block_r, ready_w):
                os.close(fd)
        if warm and "cpu" in cgroups:
            # bwrap's own set-up (namespaces, mounts) at idle priority too; it usually
            # has not cloned the jail yet, and the jail joins this cgroup anyway.
            jail.cgroups_join({"cpu": cgroups["cpu"]}, proc.pid)
        REAPER.watch(proc)
        with self._lock:
            for sid, old in list(self._bwraps.items()):
                if old.returncode is not None:  # jails destroyed by another process
                    del self._bwraps[sid]
            self._bwraps[spec.sandbox_id] = proc
        jail_pid = 0
        slirp: subprocess.Popen[bytes] | None = None
        slirp_ready: int | None = None
        try:
            info = _read_json_fd(info_r, CREATE_TIMEOUT_S)
            jail_pid = int(info["child-pid"])
            # The jail is blocked on block_fd until it sits in its cgroups.
            jail.cgroups_join(cgroups, jail_pid)
            try:
                os.write(block_w, b"x")
            except BrokenPipeError:  # bwrap gave up during its set-up
                raise ProviderUnavailable(
                    f"the sandbox did not start: {_tail(sdir / 'jail.log')}"
                ) from None
            ticks = jail.start_ticks(jail_pid) or 0
            firewall = None
            if spec.network:  # set up while the agent starts
                slirp, slirp_ready, firewall = self._start_network(sdir, jail_pid, cgroups)
            created = time.time()
            jail.JailState(
                sandbox_id=spec.sandbox_id,
                created_at=created,
                bwrap_pid=proc.pid,
                jail_pid=jail_pid,
                jail_start_ticks=ticks,
                cgroups=cgroups,
                network=spec.network,
                timeout_s=spec.timeout_s,
                labels=dict(spec.labels),
                resources=dict(res.__dict__),
                slirp_pid=slirp.pid if slirp else 0,
                slirp_start_ticks=(jail.start_ticks(slirp.pid) or 0) if slirp else 0,
                pool_owner_pid=os.getpid() if warm else 0,
                pool_owner_ticks=(jail.start_ticks(os.getpid()) or 0) if warm else 0,
                host_uid=host_uid,
            ).save(sdir / "state.json")
            deadline = time.monotonic() + CREATE_TIMEOUT_S
            if not _read_ready(ready_r, deadline):
                raise ProviderUnavailable(f"the sandbox did not start: {_tail(sdir / 'jail.log')}")
            if slirp_ready is not None and not _read_ready(slirp_ready, deadline):
                raise ProviderUnavailable(f"slirp4netns did not start: {_tail(sdir / 'jail.log')}")
            if firewall is not None and _wait_proc(firewall, deadline) != 0:
                raise ProviderUnavailable(
                    f"cannot install the sandbox's firewall: {_tail(sdir / 'jail.log')}"
                )
        except BaseException:
            if jail_pid > 0:  # killing PID 1 of the jail ends every process in it
                try:
                    os.kill(jail_pid, signal.SIGKILL)
                except OSError:
                    pass
            if slirp is not None:
                slirp.kill()
            raise
        finally:
            for leftover in (info_r, block_w, ready_r, slirp_ready):
                if leftover is not None:
                    os.close(leftover)
        return SandboxHandle(
            provider=self.name,
            provider_id=spec.sandbox_id,
            state=SandboxState.RUNNING,
            created_at=datetime.fromtimestamp(created, tz=UTC),
            labels=dict(spec.labels),
        )

    def _start_network(
        self, sdir: Path, jail_pid: int, cgroups: dict[str, str]
    ) -> tuple[subprocess.Popen[bytes], int, subprocess.Popen[bytes]]:
        """Start slirp4netns and the firewall on the jail's namespace (net.py).

        Returns (slirp4netns, the fd it reports ready on, the firewall installer).
        """
        assert self._net_tools is not None
        ready_r, ready_w = os.pipe()
        log = open(sdir / "jail.log", "ab")  # noqa: SIM115 - handed to the children
        try:
            slirp = net.start_slirp(self._net_tools, jail_pid, ready_w, log)
            REAPER.watch(slirp)
            try:
                # In the jail's cgroups it shares its limits and dies with them.
                jail.cgroups_join(cgroups, slirp.pid)
                firewall = net.start_firewall(self._net_tools, jail_pid, log)
                REAPER.watch(firewall)
            except BaseException:
                slirp.kill()
                raise
        except BaseException:
            os.close(ready_r)
            raise
        finally:
            log.close()
            os.close(ready_w)
        return slirp, ready_r, firewall

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
        emptied = jail.cgroups_remove(cgroups)
        self._cpu_samples.pop(provider_id, None)
        volume.remove(sdir)
        host_uid = _read_uid_file(sdir)
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
        memory = 0
        cpu_percent = 0.0
        process_count = 0
        cg = state.cgroups
        if "memory" in cg:
            memory = int((jail.read_text(f"{cg['memory']}/memory.usage_in_bytes") or "0").strip())
        if "cpuacct" in cg:
            usage = int((jail.read_text(f"{cg['cpuacct']}/cpuacct.usage") or "0").strip())
            mono = time.monotonic()
            prev = self._cpu_samples.get(provider_id)
            self._cpu_samples[provider_id] = (mono, usage)
            if prev is not None and mono - prev[0] < 60 and mono > prev[0]:
                cpu_percent = (usage - prev[1]) / 1e9 / (mono - prev[0]) * 100
            elif uptime > 0:
                cpu_percent = usage / 1e9 / uptime * 100
        if "pids" in cg:  # neither the agent nor slirp4netns counts
            pids = [p for p in jail.cgroup_pids(cg["pids"]) if p != state.slirp_pid]
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
        if {"memory", "pids"} <= self._cgroup_bases.keys():
            limits = "cgroup v1 limits: " + ",".join(sorted(self._cgroup_bases))
        else:
            limits = (
                "cgroups unavailable: per-process rlimits only (RLIMIT_AS, no process-count limit)"
            )
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
        return ProviderHealth(True, f"bwrap ok; {limits}; {disk}; {network}", _ms(started))

    # -------------------------------------------------------------- execution

    def exec(self, provider_id: str, request: ExecRequest) -> ExecResult:
        """Run one command to completion; a timeout kills its whole tree (exit -9)."""
        if request.args is None:
            argv = ["/bin/sh", "-c", request.command]
        else:
            argv = [request.command, *request.args]
        return self._exec(provider_id, argv, request)

    def _exec(self, provider_id: str, argv: list[str], request: ExecRequest) -> ExecResult:
        if any("\x00" in a for a in argv):
            raise InvalidRequest("command contains a NUL byte")
        env = {str(k): str(v) for k, v in request.env.items()}
        _check_env(env)
        if request.timeout_s <= 0 or request.max_output_bytes < 0:
            raise InvalidRequest("timeout_s must be positive, max_output_bytes not negative")
        stdin = request.stdin or b""
        header = {
            "op": "exec",
            "argv": argv,
            "cwd": _jail_cwd(request.cwd),
            "env": env,
            "timeout_s": request.timeout_s,
            "max_output_bytes": request.max_output_bytes,
            "stdin_len": len(stdin),
        }
        _, state = self._state(provider_id)
        oom_before = _oom_kills(state)
        sock = self._connect(provider_id, timeout=request.timeout_s + 15)
        try:
            sock.sendall(json.dumps(header).encode() + b"\n" + stdin)
            reply = wire.reply(sock)
            out_len, err_len = int(reply["stdout_len"]), int(reply["stderr_len"])
            if not (
                0 <= out_len <= request.max_output_bytes
                and 0 <= err_len <= request.max_output_bytes
            ):
                raise ProviderError("the sandbox agent sent an oversized reply")
            body = wire.recv_exact(sock, out_len + err_len)
        except (OSError, ValueError, KeyError) as exc:
            raise self._lost(provider_id, exc) from None
        finally:
            sock.close()
        exit_code = int(reply["exit_code"])
        oom = exit_code == -9 and not reply["timed_out"] and _oom_kills(state) > oom_before
        return ExecResult(
            stdout=body[:out_len],
            stderr=body[out_len:],
            exit_code=exit_code,
            duration_ms=float(reply["duration_ms"]),
            timed_out=bool(reply["timed_out"]),
            stdout_truncated=bool(reply["stdout_truncated"]),
            stderr_truncated=bool(reply["stderr_truncated"]),
            cpu_time_ms=_opt_float(reply.get("cpu_time_ms")),
            peak_memory_bytes=_opt_int(reply.get("peak_memory_bytes")),
            oom_killed=oom,
        )

    def exec_stream(self, provider_id: str, request: ExecRequest) -> AgentExecStream:
        """Start a command and stream its output (see base.ExecStream)."""
        argv = (
            ["/bin/sh", "-c", request.command]
            if request.args is None
            else [request.command, *request.args]
        )
        if any("\x00" in a for a in argv):
            raise InvalidRequest("command contains a NUL byte")
        env = {str(k): str(v) for k, v in request.env.items()}
        _check_env(env)
        if request.timeout_s <= 0:
            raise InvalidRequest("timeout_s must be positive")
        sock = self._connect(provider_id, timeout=CONTROL_TIMEOUT_S)
        try:
            sock.sendall(
                wire.exec_stream_request(argv, _jail_cwd(request.cwd), env, request.timeout_s)
            )
            reply = wire.reply(sock)
            stream = AgentExecStream(sock, int(reply["pid"]))
        except BaseException as exc:
            sock.close()
            if isinstance(exc, (OSError, ValueError, KeyError)):
                raise self._lost(provider_id, exc) from None
            raise
        if request.stdin:
            stream.write_stdin(request.stdin)
        return stream

    # ------------------------------------------------------------------ files

    def read_file(
        self, provider_id: str, path: str, offset: int = 0, length: int | None = None
    ) -> bytes:
        return self._workspace(provider_id).read(path, offset, length)

    def write_file(self, provider_id: str, path: str, data: bytes) -> FileEntry:
        """Creates parent directories; raises FileTooLarge beyond max_file_bytes."""
        return self._workspace(provider_id).write(path, data)

    def mkdir(self, provider_id: str, path: str) -> FileEntry:
        return self._workspace(provider_id).mkdir(path)

    def list_files(self, provider_id: str, path: str, recursive: bool = False) -> list[FileEntry]:
        return self._workspace(provider_id).list_entries(path, recursive)

    def stat(self, provider_id: str, path: str) -> FileEntry:
        return self._workspace(provider_id).stat(path)

    def exists(self, provider_id: str, path: str) -> bool:
        return self._workspace(provider_id).exists(path)

    def remove(self, provider_id: str, path: str, recursive: bool = False) -> None:
        self._workspace(provider_id).remove(path, recursive)

    def move(self, provider_id: str, src: str, dst: str) -> FileEntry:
        return self._workspace(provider_id).move(src, dst)

    # -------------------------------------------------------------- processes

    def start_process(
        self,
        provider_id: str,
        command: str,
        args: Sequence[str] | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ProcessInfo:
        """Start a background process (output discarded); `args is None` runs `sh -c command`."""
        argv = ["/bin/sh", "-c", command] if args is None else [command, *args]
        if any("\x00" in a for a in argv):
            raise InvalidRequest("command contains a NUL byte")
        env_d = {str(k): str(v) for k, v in (env or {}).items()}
        _check_env(env_d)
        reply = self._call(
            provider_id,
            {
                "op": "start",
                "argv": argv,
                "command": " ".join([command, *(args or [])]),
                "cwd": _jail_cwd(cwd),
                "env": env_d,
            },
        )
        return _process(reply["process"])

    def list_processes(self, provider_id: str) -> list[ProcessInfo]:
        """Processes started with start_process (recently exited ones with their exit code)."""
        reply = self._call(provider_id, {"op": "list"})
        return [_process(p) for p in reply["processes"]]

    def signal_process(self, provider_id: str, pid: int, signal: int) -> None:
        """Signal the process group of a started process (or any pid inside the jail)."""
        self._call(provider_id, {"op": "signal", "pid": int(pid), "signal": int(signal)})

    # --------------------------------------------------------------- realtime

    def open_pty(
        self,
        provider_id: str,
        cols: int = 80,
        rows: int = 24,
        shell: str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> AgentPtySession | AgentRelayPtySession:
        """A terminal inside the jail. The agent creates the PTY and the shell in the jail
        and passes the PTY master to us, so keystrokes and output skip the agent;
        fileno() is that master (non-blocking). If the descriptor cannot be passed the
        agent relays the bytes over its connection instead, as before."""
        env_d = {str(k): str(v) for k, v in (env or {}).items()}
        _check_env(env_d)
        argv = [shell or "/bin/bash"]
        sock = self._connect(provider_id, timeout=CONTROL_TIMEOUT_S)
        master = None
        try:
            sock.sendall(
                json.dumps(
                    {
                        "op": "pty",
                        "argv": argv,
                        "cols": int(cols),
                        "rows": int(rows),
                        "cwd": _jail_cwd(cwd),
                        "env": env_d,
                        "pass_fd": True,
                    }
                ).encode()
                + b"\n"
            )
            reply, master = wire.pty_reply(sock)
            pid = int(reply["pid"])
            if reply.get("mode") == "fd":
                if master is None:
                    raise ProviderError("the sandbox agent did not pass the terminal")
                return AgentPtySession(master, sock, pid)
            if master is not None:  # a relay needs no descriptor
                os.close(master)
                master = None
            sock.setblocking(False)
            return AgentRelayPtySession(lambda req: self._call(provider_id, req), sock, pid)
        except BaseException as exc:
            sock.close()
            if master is not None:
                os.close(master)
            if isinstance(exc, (OSError, ValueError, KeyError)):
                raise self._lost(provider_id, exc) from None
            raise

    def open_ports(self, provider_id: str) -> list[OpenPort]:
        """TCP ports listening inside the jail's network namespace (/proc/net/tcp{,6})."""
        reply = self._call(provider_id, {"op": "ports"})
        return [OpenPort(port=int(p["port"]), address=str(p["address"])) for p in reply["ports"]]

    def connect_port(self, provider_id: str, port: int) -> AgentPortStream:
        """A byte stream to 127.0.0.1:port inside the jail, spliced by the agent."""
        sock = self._connect(provider_id, timeout=CONTROL_TIMEOUT_S)
        try:
            sock.sendall(json.dumps({"op": "connect", "port": int(port)}).encode() + b"\n")
            wire.reply(sock)
        except BaseException:
            sock.close()
            raise
        sock.settimeout(None)
        return AgentPortStream(sock)

    def watch(
        self, provider_id: str, path: str, recursive: bool = True
    ) -> Iterator[list[FileEvent]]:
        """Host-side inotify; watches are in place when this returns. Close with .close()."""
        return WorkspaceWatch(self._workspace(provider_id), path, recursive)

    # ------------------------------------------------------------ agent calls

    def agent_socket(self, provider_id: str) -> socket.socket:
        """A new connection to the sandbox's agent, for its session ops (terminals and
        runs that outlive a web process: sandboxes/agent_sessions.py)."""
        return self._connect(provider_id, timeout=CONTROL_TIMEOUT_S)

    def _connect(self, provider_id: str, timeout: float) -> socket.socket:
        run_dir = self._dir(provider_id) / "run"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        dir_fd = None
        try:
            target = str(run_dir / "agent.sock")
            if len(target.encode()) > 100:
                # Unix socket paths are limited to 107 bytes; reach a deep root through a
                # descriptor of its directory instead.
                dir_fd = os.open(run_dir, os.O_PATH | os.O_DIRECTORY)
                target = f"/proc/self/fd/{dir_fd}/agent.sock"
            _connect_patiently(sock, target, timeout)
        except OSError:
            sock.close()
            if not (self.root_dir / provider_id).exists():
                raise SandboxGone(f"no sandbox {provider_id!r}") from None
            raise SandboxGone(f"sandbox {provider_id} is stopped") from None
        finally:
            if dir_fd is not None:
                os.close(dir_fd)
        return sock

    def _call(self, provider_id: str, request: dict, timeout: float = CONTROL_TIMEOUT_S) -> dict:
        sock = self._connect(provider_id, timeout)
        try:
            sock.sendall(json.dumps(request).encode() + b"\n")
            return wire.reply(sock)
        except (OSError, ValueError, KeyError) as exc:
            raise self._lost(provider_id, exc) from None
        finally:
            sock.close()

    def _lost(self, provider_id: str, exc: Exception) -> ProviderError:
        if not (self.root_dir / provider_id).exists():
            return SandboxGone(f"no sandbox {provider_id!r}")
        try:
            _, state = self._state(provider_id)
        except SandboxGone as gone:
            return gone
        if not jail.jail_alive(state):
            return SandboxGone(f"sandbox {provider_id} stopped")
        return ProviderError(f"lost the sandbox agent: {exc!r}")


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def _check_env(env: Mapping[str, str]) -> None:
    for key, value in env.items():
        if not key or "=" in key or "\x00" in key or "\x00" in value:
            raise InvalidRequest(f"invalid environment variable {key!r}")


def _connect_patiently(sock: socket.socket, target: str, timeout: float) -> None:
    """connect(), waiting while the agent's listen backlog is full: a Unix socket answers
    that with EAGAIN at once (the agent is busy, e.g. out of descriptors), not by blocking."""
    deadline = time.monotonic() + timeout
    pause = 0.001
    while True:
        try:
            sock.connect(target)
            return
        except BlockingIOError:
            if time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 0.05)


def _jail_cwd(cwd: str | None) -> str:
    if not cwd:
        return JAIL_WORKSPACE
    if "\x00" in cwd:
        raise InvalidRequest("cwd contains a NUL byte")
    return cwd if cwd.startswith("/") else f"{JAIL_WORKSPACE}/{cwd}"


def _wait_readable(fd: int, timeout: float) -> bool:
    ready, _, _ = select.select([fd], [], [], timeout)
    return bool(ready)


def _read_ready(fd: int, deadline: float) -> bool:
    """Whether a child reported ready on `fd` (any byte) before `deadline`; EOF is False."""
    return _wait_readable(fd, max(0.0, deadline - time.monotonic())) and bool(os.read(fd, 16))


def _wait_proc(proc: subprocess.Popen[bytes], deadline: float) -> int | None:
    """The exit status of `proc`, killing it when it outlives `deadline`."""
    try:
        return proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        return None


def _read_json_fd(fd: int, timeout: float) -> dict:
    """Read bwrap's --info-fd JSON (it may arrive in pieces; EOF means bwrap failed)."""
    deadline = time.monotonic() + timeout
    buf = b""
    while True:
        if not _wait_readable(fd, max(0.0, deadline - time.monotonic())):
            raise ProviderUnavailable("bwrap did not report its child pid")
        chunk = os.read(fd, 4096)
        if not chunk:
            raise ProviderUnavailable("bwrap exited before starting the sandbox")
        buf += chunk
        try:
            return json.loads(buf)
        except ValueError:
            continue


def _tail(path: Path) -> str:
    try:
        return path.read_bytes()[-500:].decode(errors="replace").strip()
    except OSError:
        return ""


def _process(data: dict) -> ProcessInfo:
    return ProcessInfo(
        pid=int(data["pid"]),
        command=str(data["command"]),
        running=bool(data["running"]),
        exit_code=_opt_int(data.get("exit_code")),
        started_at=_opt_float(data.get("started_at")),
    )


def _opt_int(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[call-overload]


def _opt_float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def _oom_kills(state: jail.JailState) -> int:
    path = state.cgroups.get("memory")
    text = jail.read_text(f"{path}/memory.oom_control") if path else None
    for line in (text or "").splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return 0


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


_UID_FILE = "host_uid"


def _own_uid_file(sdir: Path, host_uid: int) -> None:
    """Record the jail's host uid before anything runs as it, so a teardown that finds
    no state.json (a create that failed early) still gives the uid back."""
    fd = os.open(sdir / _UID_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(str(host_uid))


def _read_uid_file(sdir: Path) -> int | None:
    try:
        return int((sdir / _UID_FILE).read_text())
    except (OSError, ValueError):
        return None


def _hand_over_dirs(sdir: Path, host_uid: int) -> None:
    """Give the jail's uid its three writable directories; the sandbox directory itself
    stays the server's (state.json, jail.log), passable but not listable."""
    os.chmod(sdir, 0o711)  # noqa: S103 - passable by jail uids, not listable
    for sub, mode in (("workspace", 0o755), ("tmp", 0o1777), ("run", 0o755)):
        path = sdir / sub
        os.chown(path, host_uid, host_uid)
        os.chmod(path, mode)


class _RunAs(TypedDict, total=False):
    user: int
    group: int
    extra_groups: list[int]


def _run_as(host_uid: int) -> _RunAs:
    """Popen arguments that start bwrap as `host_uid` (no supplementary groups), when
    that is not who we are already."""
    if host_uid == os.geteuid():
        return {}
    return {"user": host_uid, "group": host_uid, "extra_groups": []}


def _check_passable(root_dir: Path) -> None:
    """bwrap runs as the jail's uid and opens the jail's directories by path, so every
    directory above `root_dir` must let other users pass (o+x)."""
    for directory in Path(os.path.abspath(root_dir)).parents:
        if not os.stat(directory).st_mode & 0o001:
            raise ProviderUnavailable(
                f"The local provider's root {root_dir} is below {directory}, which other "
                "users may not pass through, so the sandboxes' unprivileged host uids could "
                "not reach their files. Set SANDPIT_LOCAL_ROOT to a directory under a "
                f"passable path (e.g. /var/lib/sandpit/sandboxes) or `chmod o+x {directory}`."
            )
