"""Children of the agent: spawning with the sandbox's limits and default signals, the
one reaper of wait4(-1), killing a command's whole tree, and background processes."""

from __future__ import annotations

import _stat
import _thread

# posix, not os: `os` costs each agent start ~0.9 ms of CPU (_collections_abc, posixpath);
# only the modules loaded on first use (files, terminals, sessions) take it.
import posix
import resource
import sys
import time

from . import spawn as libc_spawn
from .wire import AgentError, send_line, socket

# typing costs the agent's start-up ~5 ms: imported for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal
else:
    import _signal as signal  # the C module: importing `signal` would build its enums at start

IDLE_AFTER_EXIT_S = 0.05
"""How long to keep reading output that background children still write after
the command itself exited (a command like ``server &`` must not hang)."""
KEEP_EXITED = 64
"""Exited background processes and terminals remembered for list/status."""
INTERNAL_MARK = "SANDPIT_INTERNAL"
"""In a process's initial environment (``=1``): Sandpit's own helper, never listed."""
TREE_MARK = "SANDPIT_TREE"
"""In every command's environment, a value of its own: how kill_tree finds what escaped
its session and lost its parent chain (``setsid cmd &`` in a shell that exits first
is re-parented to PID 1, outside every tree the parent links describe)."""
_CHILD_OOM_SCORE_ADJ = b"500"
"""Make user code, not the agent, the memory-cgroup OOM victim."""


class Event:
    """threading.Event without importing threading (a lock held until set)."""

    def __init__(self) -> None:
        self._lock = _thread.allocate_lock()
        self._lock.acquire()
        self._set = False

    def set(self) -> None:
        if not self._set:
            self._set = True
            self._lock.release()

    def is_set(self) -> bool:
        return self._set

    def clear(self) -> None:
        if self._set:
            self._lock.acquire()
            self._set = False

    def wait(self, timeout: float = -1) -> bool:
        if self._set:
            return True
        if self._lock.acquire(True, timeout):
            self._lock.release()
        return self._set


class Child:
    __slots__ = (
        "pid",
        "status",
        "rusage",
        "wake_w",
        "done",
        "command",
        "started_at",
        "kind",
        "tag",
    )

    def __init__(self, pid: int, command: str, kind: str, tag: str = "") -> None:
        self.pid = pid
        self.tag = tag
        self.status: int | None = None
        self.rusage: resource.struct_rusage | None = None
        self.wake_w: int | None = None
        self.done = Event()
        self.command = command
        self.started_at = time.time()
        self.kind = kind

    @property
    def exit_code(self) -> int | None:
        if self.status is None:
            return None
        return posix.waitstatus_to_exitcode(self.status)


class Reaper:
    """Single owner of wait4(-1): reaps orphans, reports registered children."""

    def __init__(self) -> None:
        self.lock = _thread.allocate_lock()
        self.children: dict[int, Child] = {}
        self.has_children = Event()

    def run(self) -> None:
        while True:
            self.has_children.clear()
            try:
                pid, status, rusage = posix.wait4(-1, 0)
            except ChildProcessError:
                self.has_children.wait()
                continue
            except InterruptedError:
                continue
            with self.lock:
                child = self.children.pop(pid, None)
            if child is None:
                continue
            child.status = status
            child.rusage = rusage
            child.done.set()
            if child.wake_w is not None:
                try:
                    posix.write(child.wake_w, b"x")
                except OSError:
                    pass


REAPER = Reaper()
CONFIG: dict = {}
TRACKED: dict[int, Child] = {}
"""Background processes and terminals by pid (most recent KEEP_EXITED exited kept)."""
TRACK_LOCK = _thread.allocate_lock()
ENVIRON: dict[str, str] = {
    key.decode(sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()): value.decode(
        sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()
    )
    for key, value in posix.environ.items()
}
"""The agent's environment, as os.environ would give it, plus a warm jail's configuration
(`server.await_config`): what every command's environment starts from (`child_env`)."""


def _child_setup(cwd: str, tty: bool) -> None:
    posix.setsid()
    if tty:
        import fcntl
        import termios

        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    for name, value in CONFIG.get("rlimits", {}).items():
        res = getattr(resource, name)
        resource.setrlimit(res, (value, value))
    try:
        # Make user code, not the agent, the memory-cgroup OOM victim.
        fd = posix.open("/proc/self/oom_score_adj", posix.O_WRONLY)
        posix.write(fd, _CHILD_OOM_SCORE_ADJ)
        posix.close(fd)
    except OSError:
        pass
    posix.chdir(cwd)


RESET_SIGNALS = tuple(
    sorted(set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}, key=int)
)
"""Every signal whose disposition a command must start with at its default: a server
launched by a script ignores SIGINT and SIGQUIT, and ignored dispositions survive exec."""


def reset_inherited_signals() -> None:
    """Undo what the agent inherited from whoever started the server: ignored signals
    (except the two Python ignores on purpose) and a blocked signal mask."""
    for sig in RESET_SIGNALS:
        if sig in (signal.SIGPIPE, signal.SIGXFSZ):
            continue
        try:
            if signal.getsignal(sig) == signal.SIG_IGN:
                signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):  # signals Python may not touch (e.g. RT ones in use)
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


WORKSPACE = "/workspace"
"""The agent's own working directory (bwrap --chdir), the default cwd of commands."""
SPAWN_LIMITS = {"fast": False}
"""Whether the agent carries the sandbox's inheritable limits itself (see _limit_self)."""
_FAST_MIN_NOFILE = 256
"""Below this the agent keeps its own fd limit and every command is forked."""


def limit_self() -> None:
    """Take on the sandbox's limits that the agent can live with, so that commands may be
    started with posix_spawn (vfork: about 1 ms less per command than os.fork, which
    copies this interpreter and runs Python in the child) and still inherit them.

    RLIMIT_NOFILE, RLIMIT_FSIZE (the agent writes no regular files; Python ignores
    SIGXFSZ) and RLIMIT_CORE are taken on here, hard limits included, before any command
    can run. RLIMIT_CPU would count the agent's own lifetime CPU, so _limit_child sets it
    on each spawned command right after exec: a CPU-seconds limit a few microseconds
    late changes nothing for the command (a child it forked within those microseconds
    would keep no CPU-seconds limit; the cgroup's CPU quota, the command timeout and the
    pids limit still hold it). With RLIMIT_AS (no memory cgroup) or a small fd limit the agent
    keeps its own limits and every command is forked with all of them applied first.

    RLIMIT_NPROC (given where no pids cgroup counts the sandbox's processes) is taken on
    in every case: the agent's own forks count against it, as a pids cgroup counts them,
    so no number of commands started through the agent passes it."""
    rlimits = CONFIG.get("rlimits", {})
    if "RLIMIT_NPROC" in rlimits:
        value = rlimits["RLIMIT_NPROC"]
        resource.setrlimit(resource.RLIMIT_NPROC, (value, value))
    if "RLIMIT_AS" in rlimits or rlimits.get("RLIMIT_NOFILE", 1 << 20) < _FAST_MIN_NOFILE:
        return
    if posix.getcwd() != WORKSPACE:
        return
    for name in ("RLIMIT_NOFILE", "RLIMIT_FSIZE", "RLIMIT_CORE"):
        if name in rlimits:
            value = rlimits[name]
            resource.setrlimit(getattr(resource, name), (value, value))
    SPAWN_LIMITS["fast"] = True


def _limit_child(pid: int) -> None:
    """What a posix_spawned command cannot inherit from the agent (see _limit_self)."""
    value = CONFIG.get("rlimits", {}).get("RLIMIT_CPU")
    try:
        if value is not None:
            resource.prlimit(pid, resource.RLIMIT_CPU, (value, value))
        fd = posix.open(f"/proc/{pid}/oom_score_adj", posix.O_WRONLY)
        try:
            posix.write(fd, _CHILD_OOM_SCORE_ADJ)
        finally:
            posix.close(fd)
    except OSError:  # it has exited already
        pass


def _posix_spawn(
    program: str, argv: list[str], env: dict[str, str], fds: tuple[int, int, int]
) -> int | None:
    """vfork+exec in a new session with every signal at its default (Python ignores
    SIGPIPE and SIGXFSZ, a script that started the server may have ignored more; see
    spawn.py for glibc's own two); None when exec failed or libc's posix_spawn is not
    loaded yet (the fork path then starts the command, or reports the error)."""
    return libc_spawn.spawn(program, argv, env, fds)


def spawn(
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    fds: tuple[int, int, int],
    *,
    kind: str,
    command: str,
    tty: bool = False,
    wake_w: int | None = None,
) -> Child:
    """Start a command in a new session with the sandbox rlimits; never raises for exec
    errors (the child prints them and exits 127, like a shell). posix_spawn when the agent
    carries the limits and nothing else is needed (no terminal, the default cwd), else
    fork+exec with everything applied in the child."""
    program = _which(argv[0], env.get("PATH", ""))
    tag = posix.urandom(8).hex()
    env = {**env, TREE_MARK: tag}
    libc_spawn.wait_loaded()
    if SPAWN_LIMITS["fast"] and not tty and cwd == WORKSPACE and program is not None:
        with REAPER.lock:
            pid = _posix_spawn(program, argv, env, fds)
            if pid is not None:
                child = Child(pid, command, kind, tag)
                child.wake_w = wake_w
                REAPER.children[pid] = child
        if pid is not None:
            _limit_child(pid)
            REAPER.has_children.set()
            return child
    shim = libc_spawn.via_shim()
    with REAPER.lock:
        pid = posix.fork()
        if pid == 0:  # child: only syscalls from here on
            try:
                for target, fd in enumerate(fds):
                    posix.dup2(fd, target)
                _child_setup(cwd, tty)
                # Ignored dispositions survive exec: user code starts with every
                # default (Python ignores SIGPIPE and SIGXFSZ, a script that started
                # the server may have ignored SIGINT and SIGQUIT) and nothing blocked.
                for sig in RESET_SIGNALS:
                    if signal.getsignal(sig) == signal.SIG_IGN:
                        signal.signal(sig, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_SETMASK, [])
                if program is None:
                    raise FileNotFoundError("command not found")
                if shim is not None:  # glibc's own two may still be ignored (spawn.py)
                    posix.execve(shim, [shim, program, *argv], env)  # noqa: S606 - our shim
                posix.execve(program, argv, env)  # noqa: S606 - argv is the command by design
            except BaseException as exc:  # noqa: BLE001 - report anything, then die
                # As the exec shim words it: "sandpit: ./x: Exec format error".
                detail = (
                    posix.strerror(exc.errno) if isinstance(exc, OSError) and exc.errno else exc
                )
                try:
                    posix.write(2, f"sandpit: {argv[0]}: {detail}\n".encode(errors="replace"))
                finally:
                    posix._exit(127)
        child = Child(pid, command, kind, tag)
        child.wake_w = wake_w
        REAPER.children[pid] = child
    REAPER.has_children.set()
    return child


def _is_dir(path: str) -> bool:
    try:
        return _stat.S_ISDIR(posix.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def _which(name: str, path: str) -> str | None:
    """PATH lookup in the agent, before fork: os.execvpe in the child would import
    `warnings` and touch copy-on-write pages (~0.7 ms per command)."""
    if "/" in name:
        return name
    for directory in path.split(":"):
        candidate = f"{directory or '.'}/{name}"
        if posix.access(candidate, posix.X_OK) and not _is_dir(candidate):
            return candidate
    return None


def _session_members(sid: int, tag: str = "") -> list[int]:
    """PIDs whose session or parent chain leads to `sid` (the command's tree), or whose
    environment carries the command's `tag` (see TREE_MARK)."""
    parents: dict[int, int] = {}
    members: list[int] = []
    mark = f"{TREE_MARK}={tag}".encode() if tag else b""
    for entry in posix.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2 :].split()
        pid = int(entry)
        parents[pid] = int(fields[1])
        if pid == 1 or pid == posix.getpid():
            continue
        if int(fields[3]) == sid or mark and _environ_has(pid, mark):
            members.append(pid)
    for pid in parents:
        if pid in members:
            continue
        seen = 0
        p = pid
        while p > 1 and seen < 64:
            if p == sid:
                members.append(pid)
                break
            p = parents.get(p, 0)
            seen += 1
    return members


def _environ_has(pid: int, mark: bytes) -> bool:
    """Whether `mark` (``NAME=value``) is one of `pid`'s environment entries."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read()
    except OSError:
        return False
    return environ.startswith(mark + b"\x00") or b"\x00" + mark + b"\x00" in environ


def kill_tree(pid: int, tag: str = "") -> None:
    """SIGKILL the process group and session started for `pid`, its descendants, and
    whatever carries its `tag` (see TREE_MARK)."""
    for _ in range(3):
        try:
            posix.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        members = _session_members(pid, tag)
        for member in members:
            try:
                posix.kill(member, signal.SIGKILL)
            except OSError:
                pass
        if not members:
            break


def child_env(extra: dict[str, str] | None) -> dict[str, str]:
    """The agent's environment plus `extra`, without the mark that hides the agent's own
    helpers from listings (user commands must be listed)."""
    env = dict(ENVIRON)
    env.pop(INTERNAL_MARK, None)
    if extra:
        env.update(extra)
    return env


def remember(child: Child) -> None:
    with TRACK_LOCK:
        TRACKED[child.pid] = child
        exited = [c for c in TRACKED.values() if c.done.is_set()]
        for old in exited[:-KEEP_EXITED] if len(exited) > KEEP_EXITED else []:
            TRACKED.pop(old.pid, None)


def proc_info(child: Child) -> dict:
    return {
        "pid": child.pid,
        "command": child.command,
        "running": not child.done.is_set(),
        "exit_code": child.exit_code,
        "started_at": child.started_at,
    }


def op_start(conn: socket.socket, req: dict) -> None:
    null_in = posix.open("/dev/null", posix.O_RDONLY)
    null_out = posix.open("/dev/null", posix.O_WRONLY)
    try:
        child = spawn(
            req["argv"],
            child_env(req.get("env")),
            req.get("cwd") or "/workspace",
            (null_in, null_out, null_out),
            kind="process",
            command=req.get("command") or " ".join(req["argv"]),
        )
    finally:
        posix.close(null_in)
        posix.close(null_out)
    remember(child)
    send_line(conn, {"ok": True, "process": proc_info(child)})


def op_list(conn: socket.socket, req: dict) -> None:
    """Background processes the agent started (running or among the last exited); with
    ``"all": true`` also every other live process the sandbox's user can see, except the
    init, the agent and Sandpit's helpers (a container shares its process table with
    ``docker exec``, so a listing by the agent alone would miss them)."""
    with TRACK_LOCK:
        procs = [proc_info(c) for c in TRACKED.values() if c.kind == "process"]
    if req.get("all"):
        known = {p["pid"] for p in procs}
        procs.extend(p for p in _visible_processes() if p["pid"] not in known)
    send_line(conn, {"ok": True, "processes": procs})


def _visible_processes() -> list[dict]:
    hz = posix.sysconf("SC_CLK_TCK")
    boot = _boot_time()
    me = posix.getpid()
    out = []
    for entry in posix.listdir("/proc"):
        if not entry.isdigit() or int(entry) in (1, me):
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        if INTERNAL_MARK.encode() + b"=1" in environ or not cmdline:
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()
        out.append(
            {
                "pid": pid,
                "command": cmdline.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace"),
                "running": fields[0] != b"Z",
                "exit_code": None,
                "started_at": boot + int(fields[19]) / hz,
            }
        )
    return sorted(out, key=lambda p: p["pid"])


def _boot_time() -> int:
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("btime "):
                return int(line.split()[1])
    return 0


def op_signal(conn: socket.socket, req: dict) -> None:
    pid = int(req["pid"])
    sig = int(req["signal"])
    if pid <= 1 or pid == posix.getpid():
        raise AgentError("process_not_found", f"no process {pid}")
    if sig not in signal.valid_signals():
        raise AgentError("invalid_request", f"unknown signal {sig}")
    child = TRACKED.get(pid)
    try:
        if child is not None:
            if child.done.is_set():
                raise AgentError("process_not_found", f"process {pid} has exited")
            try:
                posix.killpg(pid, sig)
            except ProcessLookupError:
                posix.kill(pid, sig)
        else:
            posix.kill(pid, sig)
    except ProcessLookupError:
        raise AgentError("process_not_found", f"no process {pid}") from None
    send_line(conn, {"ok": True})
