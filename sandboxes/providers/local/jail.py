"""One bubblewrap jail per sandbox: its directory layout, bwrap command line and state (its
cgroups are jail_cgroups.py's).

Layout of ``root_dir/<id>/`` (0711, owned by the host user running Sandpit; the
jail's own host uid may pass through it to the three directories it owns)::

    vol/         a tmpfs of resources.disk_mb holding the three below (see volume.py)
    workspace/   bind-mounted read-write at /workspace (the cwd, HOME)
    tmp/         bind-mounted at /tmp
    run/         bind-mounted at /run/sandpit; the agent's socket lives here
    state.json   pids, cgroup paths, spec; enough for any process to reap the jail
    jail.log     bwrap's and the agent's stderr (host-only)

bwrap runs as the jail's own unprivileged host uid (identity.py) with
``--unshare-user``: uid 1000 inside maps to that uid outside, without any
capability (``--cap-drop ALL``), so the jail is never host root, even when
Sandpit is. ``/proc/sys`` is read-only inside and the /proc files container
runtimes mask are covered with an empty device (see ``_MASKED_PROC``). Only /usr
and a hand-picked list of /etc files of the host are mounted, or, for a sandbox started
from a template, the template's own read-only root file system (rootfs.py) instead.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from sandboxes.providers import agent_bundle
from sandboxes.providers.base import Resources
from sandboxes.providers.local import volume
from sandboxes.providers.local.net import RESOLV_CONF

SANDBOX_UID = 1000
JAIL_AGENT = "/opt/sandpit/agent.pyz"
JAIL_EXEC_SHIM = "/opt/sandpit/exec-shim"
"""Where a jail sees the agent's exec shim (sandboxes/agent/exec_shim.c), when built."""
JAIL_PYTHON = "/usr/bin/python3"
"""The interpreter the agent runs under in a jail without a template's root file system."""
_AGENT_MAIN = (
    f"import sys; sys.argv[0] = {JAIL_AGENT!r}; sys.path.insert(0, sys.argv[0]); "
    f"from {agent_bundle.PACKAGE}.server import main; main()"
)
"""The agent's entry, run with ``-c``: running the zip file itself would import runpy
(and importlib.util, contextlib, collections, functools with it), ~2.5 ms of each jail's
~15 ms of start-up CPU. argv[0] names the bundle as before (the agent re-runs it for
watch sessions)."""
JAIL_SOCKET = "/run/sandpit/agent.sock"
JAIL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MIB = 1024 * 1024

ETC_FILES = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "nsswitch.conf",
    "host.conf",
    "gai.conf",
    "protocols",
    "services",
    "localtime",
    "mime.types",
    "ssl/certs",
    "ssl/openssl.cnf",
    "ca-certificates",
    "ca-certificates.conf",
    "alternatives",
    "inputrc",
    "bash.bashrc",
    "profile",
    "terminfo",
    "magic",
    "mailcap",
    "debian_version",
    "os-release",
    # Debian's JDKs keep their security and logging configuration here (the JVM refuses to
    # start without java.security), so the host's Java runs in a jail.
    "java-11-openjdk",
    "java-17-openjdk",
    "java-21-openjdk",
    "java-25-openjdk",
)
_TOP_LEVEL = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
# What Docker/runc mask by default: kernel memory, keys, timers and debug views. Files get
# /dev/null bound over them, directories an empty read-only tmpfs. Only paths this
# kernel has are covered (bwrap cannot bind over a missing file).
_MASKED_PROC_FILES = (
    "/proc/kcore",
    "/proc/keys",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/latency_stats",
    "/proc/sysrq-trigger",
    "/proc/kallsyms",
)
_MASKED_PROC_DIRS = (
    "/proc/acpi",
    "/proc/asound",
    "/proc/scsi",
    "/proc/fs",
    "/proc/irq",
    "/proc/bus",
)


def read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


# ---------------------------------------------------------------------------
# state and processes
# ---------------------------------------------------------------------------


@dataclass
class JailState:
    sandbox_id: str
    created_at: float
    bwrap_pid: int
    jail_pid: int
    jail_start_ticks: int
    cgroups: dict[str, str]
    network: bool
    timeout_s: int
    labels: dict[str, str]
    resources: dict[str, float] | None
    """The limits written at the start or the claim; None where one could not be."""
    slirp_pid: int = 0
    slirp_start_ticks: int = 0
    pool_owner_pid: int = 0
    """Non-zero while the jail is an unclaimed warm jail of that process (see pool.py)."""
    pool_owner_ticks: int = 0
    host_uid: int = -1
    """The host uid the jail runs as (identity.py); -1 in states written before it existed."""
    etc_dir: str = ""
    """The host directory bound at the jail's /etc (etc.py); empty on a template's root."""
    cpu_base_ns: int = 0
    """CPU time its cgroup had used when the sandbox took it (a claimed warm jail on cgroup
    v2, whose counter cannot be zeroed); stats count from there."""

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(self.__dict__))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> JailState | None:
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None


def start_ticks(pid: int) -> int | None:
    """The process start time (clock ticks since boot): tells a pid from a reused one."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def jail_alive(state: JailState) -> bool:
    return state.jail_pid > 0 and start_ticks(state.jail_pid) == state.jail_start_ticks


def pool_owner_alive(state: JailState) -> bool:
    """Whether the jail is an unclaimed warm jail whose owning process still runs."""
    return state.pool_owner_pid > 0 and (
        start_ticks(state.pool_owner_pid) == state.pool_owner_ticks
    )


_libc = ctypes.CDLL(None, use_errno=True)
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def move_onto_reserved(src: Path, reserved: Path) -> bool:
    """Put directory `src` where the empty directory `reserved` is, in one step with the
    check that it still is: False, and nothing moved, when `reserved` is gone (a destroy
    of the sandbox being created removed it). renameat2's RENAME_EXCHANGE swaps the two,
    then the empty one is removed under `src`'s old name; where the file system cannot
    swap, a check and a rename do, which a destroy could fall between."""
    if (
        _libc.renameat2(
            _AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(reserved), _RENAME_EXCHANGE
        )
        == 0
    ):
        os.rmdir(src)
        return True
    error = ctypes.get_errno()
    if error == errno.ENOENT and src.exists():
        return False
    if error not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        raise OSError(error, os.strerror(error), os.fspath(src))
    if not reserved.is_dir():
        return False
    os.rename(src, reserved)  # onto an empty directory: replaces it
    return True


def kill_if_same(pid: int, ticks: int) -> None:
    """SIGKILL `pid` unless it has exited or its number now belongs to another process."""
    if pid > 0 and start_ticks(pid) == ticks:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


# ---------------------------------------------------------------------------
# the bwrap command line
# ---------------------------------------------------------------------------


GENERATED_ETC = {
    "passwd": (
        "root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n"
        f"sandbox:x:{SANDBOX_UID}:{SANDBOX_UID}:sandbox:/workspace:/bin/bash\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    ),
    "group": f"root:x:0:\nsandbox:x:{SANDBOX_UID}:\nnogroup:x:65534:\n",
    "hosts": "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    "hostname": "sandbox\n",
}
"""The /etc files every jail gets from us, not from the host (no host accounts leak in)."""
NETWORK_ETC = {"resolv.conf": RESOLV_CONF}
"""And those of a jail with network."""


def write_shared_etc(etc_dir: Path) -> None:
    """The generated /etc files, for jails on a template's root file system (the others
    get them in their /etc directory, etc.py)."""
    etc_dir.mkdir(parents=True, exist_ok=True)
    for name, text in {**GENERATED_ETC, **NETWORK_ETC}.items():
        path = etc_dir / name
        if not path.exists() or path.read_text() != text:
            tmp = etc_dir / f".{name}.tmp"
            tmp.write_text(text)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)


def install_agent(target: Path) -> None:
    """Copy the agent bundle where every jail uid may read it (the source tree may not be),
    compiled by the jails' interpreter (bwrap_argv runs /usr/bin/python3)."""
    agent_bundle.install(target, python=JAIL_PYTHON)


def bwrap_argv(
    *,
    bwrap: str,
    sandbox_dir: Path,
    shared_etc: Path,
    agent_path: Path,
    network: bool,
    env: dict[str, str],
    info_fd: int,
    block_fd: int,
    agent_config: dict,
    rootfs: Path | None = None,
    etc_dir: Path | None = None,
    exec_shim: Path | None = None,
) -> list[str]:
    """The bwrap command line of a jail. `rootfs`: a template's read-only root file system
    (rootfs.py), bound at / in place of the host's /usr, top-level links and /etc files.
    `etc_dir`: the jail's whole /etc (etc.py), in place of a bind per file. `exec_shim`:
    the agent's exec shim, bound read-only at JAIL_EXEC_SHIM."""
    args = [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_UID),
        "--disable-userns",
        "--cap-drop",
        "ALL",
        "--as-pid-1",
        "--new-session",
        "--hostname",
        "sandbox",
    ]
    if rootfs is not None:
        # Everything the template holds, read-only; the mounts below go on top of it.
        args += ["--ro-bind", str(rootfs), "/"]
    else:
        args += ["--ro-bind", "/usr", "/usr"]
        for top in _TOP_LEVEL:
            host = f"/{top}"
            if os.path.islink(host):
                args += ["--symlink", os.readlink(host), host]
            elif os.path.isdir(host):
                args += ["--ro-bind", host, host]
    # A fresh proc for the jail's pid namespace, with /proc/sys read-only whatever the
    # jail's uid (bwrap covers it only when it looks writable to bwrap itself). Sysctl
    # files answer for the reader's namespaces, so this shows the jail its own
    # hostname and network settings, not the host's.
    args += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys", "--dev", "/dev"]
    for path in _MASKED_PROC_FILES:
        if os.path.exists(path):
            args += ["--ro-bind", "/dev/null", path]
    for path in _MASKED_PROC_DIRS:
        if os.path.isdir(path):
            args += ["--tmpfs", path, "--remount-ro", path]
    # The jail always has a network namespace of its own (--unshare-all); with
    # network=True the provider attaches slirp4netns to it (see net.py), and its /etc
    # has resolv.conf.
    if rootfs is None and etc_dir is not None:
        args += ["--ro-bind", str(etc_dir), "/etc"]  # ETC_FILES and ours (etc.py)
    else:
        for name in ETC_FILES if rootfs is None else ():
            if os.path.exists(f"/etc/{name}"):
                args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
        for name in (*GENERATED_ETC, *(NETWORK_ETC if network else ())):
            args += ["--ro-bind", str(shared_etc / name), f"/etc/{name}"]
    args += [
        "--bind",
        str(volume.subdir(sandbox_dir, "workspace")),
        "/workspace",
        "--bind",
        str(volume.subdir(sandbox_dir, "tmp")),
        "/tmp",
        "--bind",
        str(volume.subdir(sandbox_dir, "run")),
        "/run/sandpit",
        "--ro-bind",
        str(agent_path),
        JAIL_AGENT,
        *(["--ro-bind", str(exec_shim), JAIL_EXEC_SHIM] if exec_shim is not None else []),
        "--chdir",
        "/workspace",
        "--clearenv",
    ]
    for key, value in env.items():
        args += ["--setenv", key, value]
    args += [
        "--info-fd",
        str(info_fd),
        "--block-fd",
        str(block_fd),
        JAIL_PYTHON,
        "-I",
        "-S",
        "-c",
        _AGENT_MAIN,
        json.dumps(agent_config),
    ]
    return args


_FLAG_ARGS = {
    **dict.fromkeys(("--ro-bind", "--bind", "--dev-bind", "--symlink", "--setenv"), 2),
    **dict.fromkeys(
        (
            "--uid",
            "--gid",
            "--cap-drop",
            "--hostname",
            "--proc",
            "--dev",
            "--tmpfs",
            "--remount-ro",
            "--chdir",
            "--info-fd",
            "--block-fd",
        ),
        1,
    ),
    **dict.fromkeys(
        ("--unshare-all", "--unshare-user", "--disable-userns", "--as-pid-1", "--new-session"),
        0,
    ),
    "--clearenv": 0,
}
"""How many values each bwrap option bwrap_argv writes takes."""
_BIND_OPTIONS = ("--ro-bind", "--bind", "--dev-bind")


def bind_sources(argv: list[str]) -> list[str]:
    """The host paths a jail's bwrap command line (bwrap_argv's, from its options on) binds
    from. Raises ValueError at an option it does not know, so that a new kind of mount in
    bwrap_argv cannot go unlisted (the launcher keeps only the mounts these need)."""
    sources = []
    at = 0
    while at < len(argv) and argv[at].startswith("--"):
        option = argv[at]
        if option not in _FLAG_ARGS:
            raise ValueError(f"bind_sources does not know bwrap's {option}")
        if option in _BIND_OPTIONS:
            sources.append(argv[at + 1])
        at += 1 + _FLAG_ARGS[option]
    return sources


def base_env(extra: dict[str, str]) -> dict[str, str]:
    env = {
        "PATH": JAIL_PATH,
        "HOME": "/workspace",
        "USER": "sandbox",
        "LOGNAME": "sandbox",
        "LANG": "C.UTF-8",
        "SHELL": "/bin/bash",
        "HOSTNAME": "sandbox",
    }
    env.update(extra)
    return env


def rlimits(res: Resources, cgroups: dict[str, str] | set[str], *, own_uid: bool) -> dict[str, int]:
    """Per-process limits the agent applies to every child, and where the jail has no
    memory or pids cgroup, the nearest rlimits instead: RLIMIT_AS (per process, not for
    the sandbox) and, for a jail with a host uid of its own (`own_uid`), RLIMIT_NPROC (the
    processes of that uid: the sandbox's, counted by the kernel as pids.max would)."""
    limits = {
        "RLIMIT_NOFILE": res.open_files,
        "RLIMIT_FSIZE": res.disk_mb * MIB,
        "RLIMIT_CPU": res.cpu_time_s,
        "RLIMIT_CORE": 0,
    }
    if "memory" not in cgroups:
        limits["RLIMIT_AS"] = res.memory_mb * MIB
    if "pids" not in cgroups and own_uid:
        limits["RLIMIT_NPROC"] = res.pids
    return limits
