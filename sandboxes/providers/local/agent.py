"""The agent that runs as PID 1 inside every local sandbox jail.

Started by LocalProvider as ``python3 -I -S agent.py CONFIG_JSON`` inside
bubblewrap. Standard library only, and no Sandpit imports: this file is
bind-mounted read-only into the jail and runs under the jail's Python.

It listens on a Unix socket and serves one request per connection. A request
is one JSON line; an ``exec`` request is followed by ``stdin_len`` raw bytes.
A reply is one JSON line (``{"ok": true, ...}`` or ``{"ok": false, "error":
code, "message": ...}``); an ``exec`` reply is followed by the raw stdout and
stderr bytes. After the reply line of a ``pty`` or ``connect`` request the
connection becomes a raw byte pipe, so the terminal hot path has no framing. A
``pty`` request with ``"pass_fd": true`` instead gets the terminal's master
descriptor attached to its reply (SCM_RIGHTS): the host then reads and writes
the terminal directly, and the connection only carries the shell's exit status
(see _hand_over). The relay remains for when the descriptor cannot be sent.

Being PID 1 of the jail's PID namespace, the agent cannot be killed by the
user's code (the kernel drops signals to PID 1 without a handler) and must
reap every orphan: one reaper thread owns ``wait4(-1)`` and hands statuses to
whoever registered the PID.

Commands start with posix_spawn (vfork) where they can: the agent then carries the
sandbox's inheritable limits itself (see ``_limit_self``), which saves about a millisecond
per command over forking this interpreter.
"""

from __future__ import annotations

import _signal as signal
import _socket as socket
import _thread
import errno
import os
import resource
import select
import sys
import time

try:  # the C halves of json: `import json` would cost ~5 ms of start-up (re, enum)
    import _json

    class _JsonContext:
        strict = True
        object_hook = None
        object_pairs_hook = None
        parse_float = float
        parse_int = int
        memo: dict = {}

        @staticmethod
        def parse_constant(name: str) -> float:
            return float(name)

    _scan = _json.make_scanner(_JsonContext())

    def _no_default(obj: object) -> object:
        raise TypeError(f"cannot encode {type(obj).__name__}")

    _encode = _json.make_encoder(
        None, _no_default, _json.encode_basestring_ascii, None, ": ", ", ", False, False, True
    )

    def json_loads(text: str) -> object:
        return _scan(text, 0)[0]

    def json_dumps(obj: object) -> str:
        return "".join(_encode(obj, 0))

except (ImportError, AttributeError, TypeError):  # another Python: take the slow path
    import json

    json_loads = json.loads
    json_dumps = json.dumps

MAX_LINE = 1 << 20
CHUNK = 65536
IDLE_AFTER_EXIT_S = 0.05
"""How long to keep reading output that background children still write after
the command itself exited (a command like ``server &`` must not hang)."""
KEEP_EXITED = 64
"""Exited background processes and terminals remembered for list/status."""
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


class AgentError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Child:
    __slots__ = ("pid", "status", "rusage", "wake_w", "done", "command", "started_at", "kind")

    def __init__(self, pid: int, command: str, kind: str) -> None:
        self.pid = pid
        self.status: int | None = None
        self.rusage = None
        self.wake_w: int | None = None
        self.done = Event()
        self.command = command
        self.started_at = time.time()
        self.kind = kind

    @property
    def exit_code(self) -> int | None:
        if self.status is None:
            return None
        return os.waitstatus_to_exitcode(self.status)


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
                pid, status, rusage = os.wait4(-1, 0)
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
                    os.write(child.wake_w, b"x")
                except OSError:
                    pass


REAPER = Reaper()
CONFIG: dict = {}
TRACKED: dict[int, Child] = {}
"""Background processes and terminals by pid (most recent KEEP_EXITED exited kept)."""
PTY_MASTERS: dict[int, int] = {}
TRACK_LOCK = _thread.allocate_lock()


def _child_setup(cwd: str, tty: bool) -> None:
    os.setsid()
    if tty:
        import fcntl
        import termios

        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    for name, value in CONFIG.get("rlimits", {}).items():
        res = getattr(resource, name)
        resource.setrlimit(res, (value, value))
    try:
        # Make user code, not the agent, the memory-cgroup OOM victim.
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        os.write(fd, _CHILD_OOM_SCORE_ADJ)
        os.close(fd)
    except OSError:
        pass
    os.chdir(cwd)


_RESET_SIGNALS = tuple(
    sorted(set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}, key=int)
)
"""Every signal whose disposition a command must start with at its default: a server
launched by a script ignores SIGINT and SIGQUIT, and ignored dispositions survive exec."""


def reset_inherited_signals() -> None:
    """Undo what the agent inherited from whoever started the server: ignored signals
    (except the two Python ignores on purpose) and a blocked signal mask."""
    for sig in _RESET_SIGNALS:
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


def _limit_self() -> None:
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
    keeps its own limits and every command is forked with all of them applied first."""
    rlimits = CONFIG.get("rlimits", {})
    if "RLIMIT_AS" in rlimits or rlimits.get("RLIMIT_NOFILE", 1 << 20) < _FAST_MIN_NOFILE:
        return
    if os.getcwd() != WORKSPACE:
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
        fd = os.open(f"/proc/{pid}/oom_score_adj", os.O_WRONLY)
        try:
            os.write(fd, _CHILD_OOM_SCORE_ADJ)
        finally:
            os.close(fd)
    except OSError:  # it has exited already
        pass


def _posix_spawn(
    program: str, argv: list[str], env: dict[str, str], fds: tuple[int, int, int]
) -> int | None:
    """vfork+exec in a new session; None when exec failed (the fork path reports it)."""
    try:
        return os.posix_spawn(
            program,
            argv,
            env,
            file_actions=[(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(fds)],
            setsid=True,
            setsigmask=(),
            # Python ignores SIGPIPE and SIGXFSZ, a script that started the server may
            # have ignored more: user code starts with every default.
            setsigdef=_RESET_SIGNALS,
        )
    except OSError:
        return None


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
    if SPAWN_LIMITS["fast"] and not tty and cwd == WORKSPACE and program is not None:
        with REAPER.lock:
            pid = _posix_spawn(program, argv, env, fds)
            if pid is not None:
                child = Child(pid, command, kind)
                child.wake_w = wake_w
                REAPER.children[pid] = child
        if pid is not None:
            _limit_child(pid)
            REAPER.has_children.set()
            return child
    with REAPER.lock:
        pid = os.fork()
        if pid == 0:  # child: only syscalls from here on
            try:
                for target, fd in enumerate(fds):
                    os.dup2(fd, target)
                _child_setup(cwd, tty)
                # Ignored dispositions survive exec: user code starts with every
                # default (Python ignores SIGPIPE and SIGXFSZ, a script that started
                # the server may have ignored SIGINT and SIGQUIT) and nothing blocked.
                for sig in _RESET_SIGNALS:
                    if signal.getsignal(sig) == signal.SIG_IGN:
                        signal.signal(sig, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_SETMASK, [])
                if program is None:
                    raise FileNotFoundError("command not found")
                os.execve(program, argv, env)  # noqa: S606 - argv is the command by design
            except BaseException as exc:  # noqa: BLE001 - report anything, then die
                try:
                    os.write(2, f"sandpit: {argv[0]}: {exc}\n".encode(errors="replace"))
                finally:
                    os._exit(127)
        child = Child(pid, command, kind)
        child.wake_w = wake_w
        REAPER.children[pid] = child
    REAPER.has_children.set()
    return child


def _which(name: str, path: str) -> str | None:
    """PATH lookup in the agent, before fork: os.execvpe in the child would import
    `warnings` and touch copy-on-write pages (~0.7 ms per command)."""
    if "/" in name:
        return name
    for directory in path.split(":"):
        candidate = f"{directory or '.'}/{name}"
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    return None


def _session_members(sid: int) -> list[int]:
    """PIDs whose session or parent chain leads to `sid` (the command's tree)."""
    parents: dict[int, int] = {}
    members: list[int] = []
    for entry in os.listdir("/proc"):
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
        if int(fields[3]) == sid and pid != 1:
            members.append(pid)
    for pid in parents:
        seen = 0
        p = pid
        while p > 1 and seen < 64:
            if p == sid:
                members.append(pid)
                break
            p = parents.get(p, 0)
            seen += 1
    return members


def kill_tree(pid: int) -> None:
    """SIGKILL the process group and session started for `pid`, and its descendants."""
    for _ in range(3):
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        members = _session_members(pid)
        for member in members:
            try:
                os.kill(member, signal.SIGKILL)
            except OSError:
                pass
        if not members:
            break


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise AgentError("invalid_request", "connection closed early")
        buf += chunk
    return bytes(buf)


def _send_line(conn: socket.socket, obj: dict) -> None:
    conn.sendall(json_dumps(obj).encode() + b"\n")


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    if extra:
        env.update(extra)
    return env


# ---------------------------------------------------------------------------
# operations
# ---------------------------------------------------------------------------


def op_exec(conn: socket.socket, req: dict, stdin: bytes) -> None:
    cap = int(req.get("max_output_bytes", 1 << 20))
    timeout = float(req.get("timeout_s", 30.0))
    started = time.monotonic()
    deadline = started + timeout
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    wake_r, wake_w = os.pipe()
    if stdin:
        in_r, in_w = os.pipe()
    else:
        in_r, in_w = os.open("/dev/null", os.O_RDONLY), -1
    try:
        child = spawn(
            req["argv"],
            _env(req.get("env")),
            req.get("cwd") or "/workspace",
            (in_r, out_w, err_w),
            kind="exec",
            command=" ".join(req["argv"]),
            wake_w=wake_w,
        )
    except BaseException:
        for fd in (out_r, err_r, wake_r, wake_w, in_w):
            if fd >= 0:
                os.close(fd)
        raise
    finally:
        os.close(in_r)
        os.close(out_w)
        os.close(err_w)
    bufs = {out_r: bytearray(), err_r: bytearray()}
    truncated = {out_r: False, err_r: False}
    poller = select.poll()
    poller.register(out_r, select.POLLIN)
    poller.register(err_r, select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    open_fds = {out_r, err_r}
    pending = memoryview(stdin) if stdin else None
    if in_w >= 0:
        os.set_blocking(in_w, False)
        poller.register(in_w, select.POLLOUT)
    timed_out = False
    exit_deadline: float | None = None
    try:
        while open_fds or not child.done.is_set():
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            limit = deadline
            if child.done.is_set():
                if exit_deadline is None:
                    exit_deadline = now + IDLE_AFTER_EXIT_S
                limit = min(limit, exit_deadline)
                if now >= exit_deadline:
                    break
            events = poller.poll(max(0.0, limit - now) * 1000)
            for fd, _ev in events:
                if fd == wake_r:
                    os.read(wake_r, 64)
                    poller.unregister(wake_r)
                elif fd == in_w:
                    try:
                        n = os.write(in_w, pending[:CHUNK]) if pending is not None else 0
                    except (BrokenPipeError, BlockingIOError) as exc:
                        n = 0
                        if isinstance(exc, BrokenPipeError):
                            pending = None
                    if pending is not None:
                        pending = pending[n:]
                    if pending is None or not len(pending):
                        poller.unregister(in_w)
                        os.close(in_w)
                        in_w = -1
                else:
                    data = os.read(fd, CHUNK)
                    if not data:
                        poller.unregister(fd)
                        open_fds.discard(fd)
                        continue
                    if exit_deadline is not None:
                        exit_deadline = time.monotonic() + IDLE_AFTER_EXIT_S
                    buf = bufs[fd]
                    room = cap - len(buf)
                    if room > 0:
                        buf += data[:room]
                    if len(data) > room:
                        truncated[fd] = True
        if timed_out:
            kill_tree(child.pid)
            child.done.wait(5.0)
    finally:
        for fd in (out_r, err_r, wake_r, wake_w, in_w):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        child.wake_w = None
    duration_ms = (time.monotonic() - started) * 1000
    ru = child.rusage
    reply = {
        "ok": True,
        "exit_code": -9 if timed_out else child.exit_code,
        "timed_out": timed_out,
        "duration_ms": duration_ms,
        "stdout_len": len(bufs[out_r]),
        "stderr_len": len(bufs[err_r]),
        "stdout_truncated": truncated[out_r],
        "stderr_truncated": truncated[err_r],
        "cpu_time_ms": (ru.ru_utime + ru.ru_stime) * 1000 if ru else None,
        "peak_memory_bytes": ru.ru_maxrss * 1024 if ru else None,
    }
    conn.sendall(json_dumps(reply).encode() + b"\n" + bytes(bufs[out_r]) + bytes(bufs[err_r]))


def _remember(child: Child) -> None:
    with TRACK_LOCK:
        TRACKED[child.pid] = child
        exited = [c for c in TRACKED.values() if c.done.is_set()]
        for old in exited[:-KEEP_EXITED] if len(exited) > KEEP_EXITED else []:
            TRACKED.pop(old.pid, None)


def _proc_info(child: Child) -> dict:
    return {
        "pid": child.pid,
        "command": child.command,
        "running": not child.done.is_set(),
        "exit_code": child.exit_code,
        "started_at": child.started_at,
    }


def op_start(conn: socket.socket, req: dict) -> None:
    null_in = os.open("/dev/null", os.O_RDONLY)
    null_out = os.open("/dev/null", os.O_WRONLY)
    try:
        child = spawn(
            req["argv"],
            _env(req.get("env")),
            req.get("cwd") or "/workspace",
            (null_in, null_out, null_out),
            kind="process",
            command=req.get("command") or " ".join(req["argv"]),
        )
    finally:
        os.close(null_in)
        os.close(null_out)
    _remember(child)
    _send_line(conn, {"ok": True, "process": _proc_info(child)})


def op_list(conn: socket.socket, req: dict) -> None:
    with TRACK_LOCK:
        procs = [_proc_info(c) for c in TRACKED.values() if c.kind == "process"]
    _send_line(conn, {"ok": True, "processes": procs})


def op_signal(conn: socket.socket, req: dict) -> None:
    pid = int(req["pid"])
    sig = int(req["signal"])
    if pid <= 1:
        raise AgentError("process_not_found", f"no process {pid}")
    if sig not in signal.valid_signals():
        raise AgentError("invalid_request", f"unknown signal {sig}")
    child = TRACKED.get(pid)
    try:
        if child is not None:
            if child.done.is_set():
                raise AgentError("process_not_found", f"process {pid} has exited")
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                os.kill(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        raise AgentError("process_not_found", f"no process {pid}") from None
    _send_line(conn, {"ok": True})


def _set_winsize(fd: int, cols: int, rows: int) -> None:
    import fcntl
    import struct
    import termios

    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def op_pty(conn: socket.socket, req: dict) -> None:
    master, slave = os.openpty()
    _set_winsize(master, int(req.get("cols", 80)), int(req.get("rows", 24)))
    env = _env(req.get("env"))
    env.setdefault("TERM", "xterm-256color")
    wake_r = wake_w = -1
    if req.get("pass_fd"):
        wake_r, wake_w = os.pipe()
    try:
        tty_path = os.ttyname(slave)
        child = spawn(
            req["argv"],
            env,
            req.get("cwd") or "/workspace",
            (slave, slave, slave),
            kind="pty",
            command=" ".join(req["argv"]),
            tty=True,
            wake_w=wake_w if wake_w >= 0 else None,
        )
    except BaseException:
        for fd in (master, wake_r, wake_w):
            if fd >= 0:
                os.close(fd)
        raise
    finally:
        os.close(slave)
    _remember(child)
    if wake_r >= 0:
        try:
            handed = _hand_over(conn, child, master, wake_r, tty_path)
        finally:
            child.wake_w = None
            os.close(wake_r)
            os.close(wake_w)
        if handed:
            return
    with TRACK_LOCK:
        PTY_MASTERS[child.pid] = master
    ended = "client"
    try:
        _send_line(conn, {"ok": True, "pid": child.pid, "mode": "relay"})
        ended = _splice(conn, master)
    finally:
        with TRACK_LOCK:
            PTY_MASTERS.pop(child.pid, None)
        # A closed client means "kill the shell"; an ended terminal means it exited.
        if ended == "client" or not child.done.wait(1.0):
            kill_tree(child.pid)
            child.done.wait(1.0)
        os.close(master)


def _hand_over(conn: socket.socket, child: Child, master: int, wake_r: int, tty_path: str) -> bool:
    """Pass the terminal's master to the host (SCM_RIGHTS) so its bytes skip the agent.

    Returns False, with `master` still open, when the descriptor cannot be sent: the
    caller then relays as before. Otherwise the agent keeps only the control side: it
    writes ``{"exit_code": N}`` when the shell exits and, when the host closes the
    connection, kills the shell's tree - always while the shell runs, and after it
    exited only if something still holds the terminal (as the relay did, whose stream
    lasted exactly that long).
    """
    line = json_dumps({"ok": True, "pid": child.pid, "mode": "fd"}).encode() + b"\n"
    try:
        sent = conn.sendmsg(
            [line], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, master.to_bytes(4, sys.byteorder))]
        )
    except OSError:
        return False  # nothing was queued: the plain reply and the relay follow
    os.close(master)
    try:
        if sent < len(line):
            conn.sendall(line[sent:])
        poller = select.poll()
        poller.register(conn.fileno(), select.POLLIN)
        poller.register(wake_r, select.POLLIN)
        while True:
            for ready, _ev in poller.poll():
                if ready == wake_r:
                    os.read(wake_r, 64)
                    poller.unregister(wake_r)
                    child.done.wait(1.0)
                    _send_line(conn, {"exit_code": child.exit_code})
                elif not conn.recv(CHUNK):  # the host sends nothing; EOF is close()
                    return True
    except OSError:
        return True
    finally:
        if not child.done.is_set() or _tty_held(tty_path):
            kill_tree(child.pid)
            child.done.wait(1.0)


def _tty_held(path: str) -> bool:
    """Whether any process of the jail still has the terminal `path` open."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or entry == "1":
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{entry}/fd/{fd}") == path:
                    return True
            except OSError:
                continue
    return False


def _splice(conn: socket.socket, fd: int) -> str:
    """Copy bytes both ways between the connection and the terminal `fd` until one
    side ends; returns "terminal" or "client". Input waiting for the terminal stops
    us reading the client (backpressure) but never stops us draining output."""
    os.set_blocking(fd, False)
    sock_fd = conn.fileno()
    poller = select.poll()
    poller.register(sock_fd, select.POLLIN)
    poller.register(fd, select.POLLIN)
    pending = b""
    while True:
        for ready, _ev in poller.poll():
            if ready == fd:
                if pending:
                    try:
                        pending = pending[os.write(fd, pending) :]
                    except BlockingIOError:
                        pass
                    except OSError:
                        return "terminal"
                    if not pending:
                        poller.modify(fd, select.POLLIN)
                        poller.register(sock_fd, select.POLLIN)
                try:
                    data = os.read(fd, CHUNK)
                except BlockingIOError:
                    continue
                except OSError:  # EIO: the terminal's last writer is gone
                    data = b""
                if not data:
                    return "terminal"
                conn.sendall(data)
            else:
                data = conn.recv(CHUNK)
                if not data:
                    return "client"
                try:
                    pending = data[os.write(fd, data) :]
                except BlockingIOError:
                    pending = data
                if pending:
                    poller.unregister(sock_fd)
                    poller.modify(fd, select.POLLIN | select.POLLOUT)


def op_pty_resize(conn: socket.socket, req: dict) -> None:
    master = PTY_MASTERS.get(int(req["pid"]))
    if master is None:
        raise AgentError("process_not_found", "terminal has ended")
    _set_winsize(master, int(req["cols"]), int(req["rows"]))
    _send_line(conn, {"ok": True})


def op_pty_status(conn: socket.socket, req: dict) -> None:
    child = TRACKED.get(int(req["pid"]))
    if child is None:
        raise AgentError("process_not_found", "unknown terminal")
    _send_line(conn, {"ok": True, "exit_code": child.exit_code})


def _jail_socket_inodes() -> set[str]:
    """Inodes of the sockets held by processes of this jail (all we can see in /proc)."""
    inodes: set[str] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{entry}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def _listening() -> list[dict]:
    """TCP ports in LISTEN state whose socket belongs to a process of this jail. With
    --share-net the table is the host's: this filter keeps host services out of
    open_ports and connect_port."""
    ours = _jail_socket_inodes()
    ports: dict[int, str] = {}
    for name in ("tcp", "tcp6"):
        try:
            with open(f"/proc/net/{name}") as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != "0A" or fields[9] not in ours:
                continue
            addr_hex, port_hex = fields[1].split(":")
            port = int(port_hex, 16)
            raw = bytes.fromhex(addr_hex)
            if len(raw) == 4:
                address = socket.inet_ntop(socket.AF_INET, raw[::-1])
            else:
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                address = socket.inet_ntop(socket.AF_INET6, words)
            ports.setdefault(port, address)
    return [{"port": p, "address": a} for p, a in sorted(ports.items())]


def op_ports(conn: socket.socket, req: dict) -> None:
    _send_line(conn, {"ok": True, "ports": _listening()})


def op_connect(conn: socket.socket, req: dict) -> None:
    port = int(req["port"])
    if not 0 < port < 65536:
        raise AgentError("invalid_request", f"bad port {port}")
    if not any(p["port"] == port for p in _listening()):
        raise AgentError("port_closed", f"nothing in the sandbox listens on port {port}")
    upstream = None
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        candidate = socket.socket(family, socket.SOCK_STREAM)
        candidate.settimeout(5)
        try:
            candidate.connect((host, port))
        except OSError:
            candidate.close()
            continue
        upstream = candidate
        break
    if upstream is None:
        raise AgentError("port_closed", f"nothing listens on port {port}")
    upstream.settimeout(None)
    try:
        _send_line(conn, {"ok": True})
        _splice_sockets(conn, upstream)
    finally:
        upstream.close()


def _splice_sockets(a: socket.socket, b: socket.socket) -> None:
    poller = select.poll()
    poller.register(a.fileno(), select.POLLIN)
    poller.register(b.fileno(), select.POLLIN)
    by_fd = {a.fileno(): (a, b), b.fileno(): (b, a)}
    half_closed = 0
    while half_closed < 2:
        for fd, _ev in poller.poll():
            src, dst = by_fd[fd]
            try:
                data = src.recv(CHUNK)
            except OSError:
                data = b""
            if data:
                dst.sendall(data)
                continue
            poller.unregister(fd)
            half_closed += 1
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                return


CONFIG_LOCK = _thread.allocate_lock()


def await_config() -> None:
    """In a warm jail, wait for the configuration of the sandbox that claimed it.

    A warm jail starts with default rlimits and no sandbox environment, and a
    ``config_fd`` pipe whose write end only the provider holds. Claiming the jail
    writes ``{"env": ..., "rlimits": ...}`` there and closes it, before any request
    can arrive; the first request applies it. Code in the jail cannot reach the
    pipe (it is read and closed before anything runs), so it cannot change its
    own limits. EOF without data (the owner died unclaimed) keeps the defaults; a
    malformed configuration ends the jail rather than run it with the wrong limits.
    """
    if CONFIG.get("config_fd") is None:
        return
    with CONFIG_LOCK:
        fd = CONFIG.get("config_fd")
        if fd is None:
            return
        chunks = []
        while True:
            chunk = os.read(fd, CHUNK)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(fd)
        if chunks:
            try:
                config = json_loads(b"".join(chunks).decode())
                env = config["env"]
                rlimits = config["rlimits"]
                if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
                    raise ValueError("env must map strings to strings")
                for name, value in rlimits.items():
                    if not (name.startswith("RLIMIT_") and hasattr(resource, name)):
                        raise ValueError(f"unknown rlimit {name}")
                    if not isinstance(value, int):
                        raise ValueError(f"rlimit {name} must be an integer")
            except Exception as exc:  # noqa: BLE001 - any flaw is fatal, see above
                os.write(2, f"sandpit agent: bad configuration: {exc!r}\n".encode())
                os._exit(70)
            os.environ.update(env)
            CONFIG["rlimits"] = rlimits
        _limit_self()
        CONFIG["config_fd"] = None


def op_ping(conn: socket.socket, req: dict) -> None:
    _send_line(conn, {"ok": True, "pid": os.getpid()})


OPS = {
    "exec": op_exec,
    "start": op_start,
    "list": op_list,
    "signal": op_signal,
    "pty": op_pty,
    "pty_resize": op_pty_resize,
    "pty_status": op_pty_status,
    "ports": op_ports,
    "connect": op_connect,
    "ping": op_ping,
}


def _read_line(conn: socket.socket) -> tuple[bytes, bytes]:
    buf = b""
    while b"\n" not in buf:
        chunk = conn.recv(CHUNK)
        if not chunk:
            raise AgentError("invalid_request", "no request")
        buf += chunk
        if len(buf) > MAX_LINE:
            raise AgentError("invalid_request", "request line too long")
    line, _, rest = buf.partition(b"\n")
    return line, rest


def handle(conn: socket.socket) -> None:
    try:
        await_config()
        line, rest = _read_line(conn)
        req = json_loads(line.decode("utf-8", "surrogateescape"))
        if not isinstance(req, dict):
            raise AgentError("invalid_request", "request must be an object")
        op = OPS.get(req.get("op"))
        if op is None:
            raise AgentError("invalid_request", f"unknown op {req.get('op')!r}")
        if op is op_exec:
            n = int(req.get("stdin_len", 0))
            stdin = rest[:n] + (_recv_exact(conn, n - len(rest)) if n > len(rest) else b"")
            op_exec(conn, req, stdin)
        else:
            op(conn, req)
    except AgentError as exc:
        _try_send(conn, {"ok": False, "error": exc.code, "message": exc.message})
    except BlockingIOError as exc:
        _try_send(conn, {"ok": False, "error": "resource_exhausted", "message": str(exc)})
    except (BrokenPipeError, ConnectionResetError):
        pass
    except Exception as exc:  # noqa: BLE001 - the agent must survive any request
        _try_send(conn, {"ok": False, "error": "agent_error", "message": repr(exc)})
    finally:
        conn.close()


def _try_send(conn: socket.socket, obj: dict) -> None:
    try:
        _send_line(conn, obj)
    except OSError:
        pass


def main() -> None:
    CONFIG.update(json_loads(sys.argv[1]))
    reset_inherited_signals()  # before any thread starts: they inherit the mask
    if CONFIG.get("config_fd") is None:  # a cold start: the limits are final already
        _limit_self()
    # No handlers for SIGTERM & co: as PID 1 without handlers the user's code
    # cannot signal the agent; the host kills the jail with SIGKILL.
    path = CONFIG["socket"]
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(128)
    _thread.start_new_thread(REAPER.run, ())
    if CONFIG.get("config_fd") is not None:  # nothing the jail runs may inherit it
        os.set_inheritable(CONFIG["config_fd"], False)
    ready_fd = CONFIG.get("ready_fd")
    if ready_fd is not None:
        os.write(ready_fd, b"ready\n")
        os.close(ready_fd)
    while True:
        try:
            fd, _ = server._accept()
        except InterruptedError:
            continue
        except OSError as exc:  # out of fds (its limit is the sandbox's): wait, do not die
            if exc.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                raise
            time.sleep(0.05)
            continue
        conn = socket.socket(fileno=fd)
        try:
            _thread.start_new_thread(handle, (conn,))
        except RuntimeError:  # out of pids: the fork bomb is still running
            _try_send(conn, {"ok": False, "error": "resource_exhausted", "message": "no pids"})
            conn.close()


if __name__ == "__main__":
    main()
