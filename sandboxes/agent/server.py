"""The agent's entry point: configuration, the request loop, and the relay mode.

Started as ``python3 -I -S agent.pyz CONFIG_JSON`` (see sandboxes/agent/__init__.py),
one thread per connection, one request per connection.
"""

from __future__ import annotations

import _thread
import errno

# posix, not os: the agent's start-up skips `os` (see procs.py)
import posix
import resource
import sys
import time

from . import PROTOCOL, execute, procs, spawn
from .procs import CONFIG, ENVIRON, REAPER, limit_self, reset_inherited_signals
from .wire import (
    CHUNK,
    OS_CODES,
    AgentError,
    accept,
    json_loads,
    read_line,
    recv_exact,
    send_line,
    socket,
    try_send,
)

# typing costs the agent's start-up ~5 ms: imported for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

CONFIG_LOCK = _thread.allocate_lock()
RELAY_CONNECT_S = 15.0


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
            chunk = posix.read(fd, CHUNK)
            if not chunk:
                break
            chunks.append(chunk)
        posix.close(fd)
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
                posix.write(2, f"sandpit agent: bad configuration: {exc!r}\n".encode())
                posix._exit(70)
            ENVIRON.update(env)
            CONFIG["rlimits"] = rlimits
        limit_self()
        CONFIG["config_fd"] = None


def op_ping(conn: socket.socket, req: dict) -> None:
    send_line(conn, {"ok": True, "pid": posix.getpid(), "protocol": PROTOCOL})


OPS: dict[str, Callable[[Any, dict], None]] = {
    "exec_stream": execute.op_exec_stream,
    "start": procs.op_start,
    "list": procs.op_list,
    "signal": procs.op_signal,
    "ping": op_ping,
}
"""The ops a sandbox that only runs commands needs; `find_op` adds the others on first use:
terminals, ports and files (`load_more`), and sessions (``session_*``, `load_sessions`)."""
BODY_OPS: dict[str, Callable[[Any, dict, bytes], None]] = {"exec": execute.op_exec}
"""The ops whose request line is followed by a body; ``write`` is added by `load_more`."""


def find_op(name: str) -> Callable[[Any, dict], None] | None:
    op = OPS.get(name)
    if op is None:
        if name.startswith("session_"):
            load_sessions()
        else:
            load_more()
        op = OPS.get(name)
    return op


def load_more() -> None:
    """Import the terminal, port and file ops (terminal.py, ports.py, files.py, and the os
    module with them) on first use: ~1.5 ms of CPU at each jail's start here, where every
    sandbox pays it and one that only runs commands never needs them."""
    from . import files, ports, terminal

    OPS.update(
        {
            "pty": terminal.op_pty,
            "pty_resize": terminal.op_pty_resize,
            "pty_status": terminal.op_pty_status,
            "ports": ports.op_ports,
            "connect": ports.op_connect,
            **files.OPS,
        }
    )
    BODY_OPS["write"] = files.op_write


def load_sessions() -> None:
    """Import the session ops (sessions.py and its termios, fcntl, struct and collections)
    on first use: most sandboxes never use them. Warm jails too: their start competes for
    the cores with the requests being served (the pool refills while they run)."""
    from . import sessions

    OPS.update(sessions.OPS)


def handle(conn: socket.socket) -> None:
    try:
        await_config()
        line, rest = read_line(conn)
        req = json_loads(line.decode("utf-8", "surrogateescape"))
        if not isinstance(req, dict):
            raise AgentError("invalid_request", "request must be an object")
        name = req.get("op")
        if name in ("exec", "write"):  # followed by a body of `stdin_len` / `size` bytes
            n = int(req.get("stdin_len" if name == "exec" else "size", 0))
            if n < 0:
                raise AgentError("invalid_request", "negative body length")
            body = rest[:n] + (recv_exact(conn, n - len(rest)) if n > len(rest) else b"")
            if name not in BODY_OPS:
                load_more()
            BODY_OPS[name](conn, req, body)
            return
        op = find_op(name) if isinstance(name, str) else None
        if op is None:
            raise AgentError("invalid_request", f"unknown op {name!r}")
        # _Prefixed stands in for the socket: the ops only recv, send and take its fileno.
        op(_Prefixed(conn, rest) if rest else conn, req)
    except AgentError as exc:
        try_send(conn, {"ok": False, "error": exc.code, "message": exc.message})
    except BlockingIOError as exc:
        try_send(conn, {"ok": False, "error": "resource_exhausted", "message": str(exc)})
    except (BrokenPipeError, ConnectionResetError):
        pass
    except OSError as exc:
        code = OS_CODES.get(exc.errno or 0, "agent_error")
        try_send(
            conn, {"ok": False, "error": code, "message": f"{exc.strerror}: {exc.filename or ''}"}
        )
    except Exception as exc:  # noqa: BLE001 - the agent must survive any request
        try_send(conn, {"ok": False, "error": "agent_error", "message": repr(exc)})
    finally:
        conn.close()


class _Prefixed:
    """A connection whose first bytes were already read with the request line (a client
    that sends input right behind an ``exec_stream`` request)."""

    def __init__(self, conn: socket.socket, rest: bytes) -> None:
        self._conn = conn
        self._rest = rest

    def recv(self, n: int) -> bytes:
        if self._rest:
            data, self._rest = self._rest[:n], self._rest[n:]
            return data
        return self._conn.recv(n)

    def __getattr__(self, name: str) -> object:
        return getattr(self._conn, name)


def relay(path: str) -> None:
    """``--relay SOCKET``: splice stdin/stdout to the agent's socket, for one connection.

    How a host reaches the agent when it cannot reach the socket itself (a remote Docker
    engine, or a runtime that does not pass Unix sockets through bind mounts): it runs
    this through ``docker exec`` and speaks the protocol over the exec's streams."""
    deadline = time.monotonic() + RELAY_CONNECT_S
    while True:  # the agent may still be starting (the first call after create)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(path)
            break
        except (FileNotFoundError, ConnectionRefusedError):
            conn.close()
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.005)
    from . import ports  # a process of its own, which serves nothing else

    ports.splice_fds(conn, 0, 1)


def main() -> None:
    if sys.argv[1:2] == ["--relay"]:
        relay(sys.argv[2])
        return
    if sys.argv[1:2] == ["--watch"]:  # a watch session's command (sessions.py)
        from . import inotify

        inotify.main(sys.argv[2], sys.argv[3])
        return
    CONFIG.update(json_loads(sys.argv[1]))
    reset_inherited_signals()  # before any thread starts: they inherit the mask
    # A warm jail (config_fd) loads libc's posix_spawn while it idles in the pool.
    spawn.start_loading(CONFIG.get("exec_shim"), preload=CONFIG.get("config_fd") is not None)
    if CONFIG.get("config_fd") is None:  # a cold start: the limits are final already
        limit_self()
    # No handlers for SIGTERM & co: as PID 1 without handlers the user's code
    # cannot signal the agent; the host kills the jail with SIGKILL.
    path = CONFIG["socket"]
    try:
        posix.unlink(path)
    except FileNotFoundError:
        pass
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    if CONFIG.get("socket_mode") is not None:  # the host may run as another uid
        posix.chmod(path, int(CONFIG["socket_mode"]))
    server.listen(128)
    _thread.start_new_thread(REAPER.run, ())
    if CONFIG.get("config_fd") is not None:  # nothing the jail runs may inherit it
        posix.set_inheritable(CONFIG["config_fd"], False)
    ready_fd = CONFIG.get("ready_fd")
    if ready_fd is not None:
        posix.write(ready_fd, b"ready\n")
        posix.close(ready_fd)
    while True:
        try:
            conn = accept(server)
        except InterruptedError:
            continue
        except OSError as exc:  # out of fds (its limit is the sandbox's): wait, do not die
            if exc.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                raise
            time.sleep(0.05)
            continue
        try:
            _thread.start_new_thread(handle, (conn,))
        except RuntimeError:  # out of pids: the fork bomb is still running
            try_send(conn, {"ok": False, "error": "resource_exhausted", "message": "no pids"})
            conn.close()
