"""Boot-up of LocalProvider's jails: a cold start (`_start`: the sandbox's directory, its
host uid, cgroups, bwrap, the agent and, with network=True, slirp4netns and the firewall),
a warm jail for the pool (`_spawn_warm`) and a warm jail turned into a sandbox (`_adopt`).
What the jail is made of (bwrap's argv, rlimits) is jail.py's, its cgroups jail_cgroups.py's; this module runs it.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from datetime import UTC, datetime
from pathlib import Path
from typing import TypedDict

from sandboxes.providers.base import (
    ProviderError,
    ProviderUnavailable,
    SandboxGone,
    SandboxHandle,
    SandboxSpec,
    SandboxState,
)
from sandboxes.providers.local import jail, jail_cgroups, launcher, net, rootfs, volume
from sandboxes.providers.local.etc import JailEtc
from sandboxes.providers.local.identity import HostIdentities
from sandboxes.providers.local.pool import WarmJail, WarmPool, pool_name
from sandboxes.providers.local.reaper import REAPER
from sandboxes.providers.local.snapshot import restore_files

CREATE_TIMEOUT_S = 10.0

BWRAP_INSTALL_HINT = (
    "The local provider needs bubblewrap: install it with `apt-get install bubblewrap` "
    "(Debian/Ubuntu) or `make run`, which installs it when run as root."
)


class JailBoot:
    """Starting jails, for LocalProvider (which sets these attributes in its __init__)."""

    name: str
    root_dir: Path
    bwrap_path: str
    _identities: HostIdentities
    _disk_quota: bool
    _launcher: Path | None
    _cgroup_bases: dict[str, str]
    _shared_etc: Path
    _etc: JailEtc
    _agent_path: Path
    _exec_shim: Path | None
    _net_tools: net.NetTools | None
    _bwraps: dict[str, subprocess.Popen[bytes]]
    _lock: threading.Lock
    _pool: WarmPool | None

    def _teardown(self, provider_id: str, sdir: Path, state: jail.JailState | None) -> None:
        raise NotImplementedError  # LocalProvider's

    def _spawn_warm(self) -> WarmJail:
        """Start a warm jail for the pool: default resources, no sandbox environment, and
        a configuration pipe whose write end stays with us (see pool.py)."""
        me = os.getpid()
        jail_id = pool_name(me, jail.start_ticks(me) or 0)
        sdir = self.root_dir / jail_id
        sdir.mkdir(mode=0o700)
        config_r, config_w = os.pipe()
        try:
            self._start(
                SandboxSpec(sandbox_id=jail_id),
                sdir,
                {},
                config_fd=config_r,
                process_start=self._pool.process_start if self._pool is not None else None,
            )
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
        On failure `sdir` is left empty again, or gone (SandboxGone: a destroy of the
        sandbox removed it meanwhile), and the caller destroys the warm jail."""
        jail_id = warm.jail_id
        wdir = self.root_dir / jail_id
        state = jail.JailState.load(wdir / "state.json")
        if state is None or not jail.jail_alive(state):
            raise ProviderUnavailable(f"warm jail {jail_id} is gone")
        res = spec.resources
        # A warm jail starts with default resources, which most creates ask for: writing
        # the same limits again cost ~0.4 ms of a create here (the CPU quota's the most).
        if state.resources != res.__dict__:
            if self._disk_quota:
                volume.resize(wdir, res.disk_mb)
            if not jail_cgroups.cgroups_set_limits(state.cgroups, res):
                raise ProviderUnavailable(f"cannot apply the limits to warm jail {jail_id}")
        jail_cgroups.cgroups_set_background(state.cgroups, False)
        state.cpu_base_ns = jail_cgroups.cgroups_reset_counters(state.cgroups)
        rlimits = jail.rlimits(res, state.cgroups, own_uid=state.host_uid != os.geteuid())
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
        # Replaces the empty directory create() reserved, unless a destroy of the sandbox
        # removed it meanwhile. Mounts below wdir move along; the jail sees its own copies
        # of them, so nothing inside notices.
        if not jail.move_onto_reserved(wdir, sdir):
            raise SandboxGone(f"sandbox {spec.sandbox_id} was destroyed while it was created")
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
        except FileNotFoundError:  # destroyed just after the move: the destroy ends it
            self._teardown(spec.sandbox_id, sdir, state)
            raise SandboxGone(
                f"sandbox {spec.sandbox_id} was destroyed while it was created"
            ) from None
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
        process_start: Callable[[], AbstractContextManager[None]] | None = None,
    ) -> SandboxHandle:
        """Start a jail for `spec` in `sdir`. With `config_fd` it is a warm jail: its
        agent takes its configuration from that pipe (see pool.py). `process_start`: around
        starting its first process (WarmPool.process_start)."""
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
        bwrap = shutil.which(self.bwrap_path)
        if bwrap is None:  # setpriv would start, then fail to exec it
            raise ProviderUnavailable(f"cannot run {self.bwrap_path}. {BWRAP_INSTALL_HINT}")
        cgroups, limited = jail_cgroups.cgroups_create(self._cgroup_bases, spec.sandbox_id, res)
        if warm:  # let it start without slowing the sandboxes in use
            jail_cgroups.cgroups_set_background(cgroups, True)
        root = rootfs.rootfs_check(spec.rootfs) if spec.rootfs else None
        # A root file system installed before the shim existed has no place to bind it.
        exec_shim = self._exec_shim
        if root is not None:
            mount_point = root / jail.JAIL_EXEC_SHIM.lstrip("/")
            if mount_point.is_symlink() or not mount_point.is_file():
                exec_shim = None
        info_r, info_w = os.pipe()
        block_r, block_w = os.pipe()
        ready_r, ready_w = os.pipe()
        config = {
            "socket": jail.JAIL_SOCKET,
            "ready_fd": ready_w,
            "rlimits": jail.rlimits(res, cgroups, own_uid=host_uid != os.geteuid()),
            "config_fd": config_fd,
            "exec_shim": jail.JAIL_EXEC_SHIM if exec_shim is not None else None,
        }
        etc_dir = None if spec.rootfs else self._etc.current(network=spec.network)
        argv = jail.bwrap_argv(
            bwrap=self.bwrap_path,
            sandbox_dir=sdir,
            shared_etc=self._shared_etc,
            etc_dir=etc_dir,
            agent_path=self._agent_path,
            exec_shim=exec_shim,
            network=spec.network,
            env=jail.base_env(env),
            info_fd=info_w,
            block_fd=block_r,
            agent_config=config,
            rootfs=root,
        )
        log = os.fdopen(  # noqa: SIM115 - handed to the child
            os.open(
                sdir / "jail.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600
            ),
            "ab",
        )
        if self._launcher is not None:
            run_as: _RunAs = {}
            argv = launcher.argv(
                self._launcher,
                self.root_dir,
                sdir / "vol" if self._disk_quota else None,
                None if host_uid == os.geteuid() else host_uid,
                [bwrap, *argv[1:]],
                jail.bind_sources(argv[1:]),
            )
        else:
            argv, run_as = _run_as(argv, host_uid)
        # Its first process, and its reaping thread should this start it, at the priority
        # process_start gives (the jail's processes inherit it).
        with (process_start or nullcontext)():
            try:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    pass_fds=(info_w, block_r, ready_w, *((config_fd,) if warm else ())),
                    start_new_session=True,
                    **run_as,
                )
            except OSError as exc:
                raise ProviderUnavailable(
                    f"cannot run {self.bwrap_path}: {exc}. {BWRAP_INSTALL_HINT}"
                ) from None
            finally:
                log.close()
                for fd in (info_w, block_r, ready_w):
                    os.close(fd)
            REAPER.watch(proc)
        if warm and "cpu" in cgroups and jail_cgroups.UNIFIED not in cgroups:
            # bwrap's own set-up (namespaces, mounts) at idle priority too; it usually
            # has not cloned the jail yet, and the jail joins this cgroup anyway. (On v2
            # bwrap would join the jail's one cgroup, and count among its processes.)
            jail_cgroups.cgroups_join({"cpu": cgroups["cpu"]}, proc.pid)
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
            jail_cgroups.cgroups_join(cgroups, jail_pid)
            try:
                os.write(block_w, b"x")
            except BrokenPipeError:  # bwrap gave up during its set-up
                raise ProviderUnavailable(
                    f"the sandbox did not start: {_tail(sdir / 'jail.log')}"
                ) from None
            ticks = jail.start_ticks(jail_pid) or 0
            firewall = None
            created = time.time()
            state = jail.JailState(
                sandbox_id=spec.sandbox_id,
                created_at=created,
                bwrap_pid=proc.pid,
                jail_pid=jail_pid,
                jail_start_ticks=ticks,
                cgroups=cgroups,
                network=spec.network,
                timeout_s=spec.timeout_s,
                labels=dict(spec.labels),
                # None where a limit could not be written: a claim of a warm jail then
                # writes them all again (and refuses the jail if it still cannot).
                resources=dict(res.__dict__) if limited else None,
                pool_owner_pid=os.getpid() if warm else 0,
                pool_owner_ticks=(jail.start_ticks(os.getpid()) or 0) if warm else 0,
                host_uid=host_uid,
                etc_dir=str(etc_dir or ""),
            )
            state.save(sdir / "state.json")
            deadline = time.monotonic() + CREATE_TIMEOUT_S
            if not _read_ready(ready_r, deadline):
                raise ProviderUnavailable(f"the sandbox did not start: {_tail(sdir / 'jail.log')}")
            if spec.network:
                # Only once the agent runs, i.e. bwrap has set the jail's loopback up:
                # slirp4netns --configure brings it up too, and started beside bwrap's
                # set-up either could find 127.0.0.1 there already and fail (bwrap then
                # ends the jail: "loopback: Failed RTM_NEWADDR"). No user code runs in the
                # jail before create returns, so the firewall is still in place first.
                slirp, slirp_ready, firewall = self._start_network(sdir, jail_pid, cgroups)
                state.slirp_pid = slirp.pid
                state.slirp_start_ticks = jail.start_ticks(slirp.pid) or 0
                state.save(sdir / "state.json")
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
                jail_cgroups.cgroups_join(cgroups, slirp.pid)
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


_UID_FILE = "host_uid"


def _own_uid_file(sdir: Path, host_uid: int) -> None:
    """Record the jail's host uid before anything runs as it, so a teardown that finds
    no state.json (a create that failed early) still gives the uid back."""
    fd = os.open(sdir / _UID_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(str(host_uid))


def read_uid_file(sdir: Path) -> int | None:
    try:
        return int((sdir / _UID_FILE).read_text())
    except (OSError, ValueError):
        return None


def _hand_over_dirs(sdir: Path, host_uid: int) -> None:
    """Give the jail's uid its three writable directories; the sandbox directory itself
    stays the server's (state.json, jail.log), passable but not listable."""
    os.chmod(sdir, 0o711)  # noqa: S103 - passable by jail uids, not listable
    for sub, mode in (("workspace", 0o755), ("tmp", 0o1777), ("run", 0o755)):
        path = volume.subdir(sdir, sub)
        os.chown(path, host_uid, host_uid)
        os.chmod(path, mode)


class _RunAs(TypedDict, total=False):
    user: int
    group: int
    extra_groups: list[int]


SETPRIV = shutil.which("setpriv")
"""util-linux's setpriv: switches the uid the way Popen(user=..., group=..., extra_groups=[])
does (real, effective and saved uid and gid; no supplementary groups; every capability gone
with uid 0), then execs bwrap."""


def _run_as(argv: list[str], host_uid: int) -> tuple[list[str], _RunAs]:
    """The argv and Popen arguments that start `argv` as `host_uid` (no supplementary
    groups), when that is not who we are already.

    Through setpriv when the host has it: Popen cannot vfork once it must change the uid
    itself, and a fork copies the whole server's page tables (~2 ms of CPU at 150 MB, and
    its other threads stall on their page faults meanwhile); setpriv's own exec is ~0.5 ms."""
    if host_uid == os.geteuid():
        return argv, {}
    if SETPRIV is not None:
        uid = str(host_uid)
        return [SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv], {}
    return argv, {"user": host_uid, "group": host_uid, "extra_groups": []}


def check_passable(root_dir: Path) -> None:
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
