"""Sessions: terminals and streamed runs that live in the agent, not in a web process.

A session is a process the agent started (a shell on a PTY, or a command on pipes) with
a bounded ring of its recent output. It keeps running whoever is attached: any number
of connections attach (``session_attach``), get the buffered output from an offset and
then live output, and may send input; closing a connection only detaches it. So a web
process is a relay that can die and be replaced without the shell noticing.

Frames both ways are ``kind (1 byte) + length (4 bytes, big-endian) + payload``.
From the agent: ``O`` output (a terminal's bytes, a run's stdout), ``E`` a run's
stderr, and last ``X`` with a JSON object (``exit_code``, ``timed_out``,
``duration_ms``). From a client: ``I`` input, ``R`` "cols rows" (terminals), ``C``
close stdin and ``K`` a signal number (runs), ``Q`` end the session now. A watch
is a session too: the agent's own watcher (inotify.py) whose records are its output.

One thread per session polls its output, its clients and its child; a client that
does not read its output for SEND_TIMEOUT_S is dropped (the others must not wait).
A run whose last client went away without a ``K`` (its web process died) keeps going
for its ``orphan_s`` and is killed if no one attaches again by then; a terminal lasts
until its shell exits or it is killed. Sessions that end by themselves stay listed for ENDED_TTL_S, killed ones are forgotten.
"""

from __future__ import annotations

import _thread
import fcntl
import os
import select
import struct
import sys
import termios
import time
from _collections import deque  # type: ignore[import-not-found]  # collections costs ~1-4 ms of start-up

from .files import resolve
from .procs import (
    IDLE_AFTER_EXIT_S,
    INTERNAL_MARK,
    TRACK_LOCK,
    WORKSPACE,
    Event,
    child_env,
    kill_tree,
    remember,
    spawn,
)
from .wire import CHUNK, AgentError, json_dumps, send_line, socket

# typing costs the agent's start-up ~5 ms: imported for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .procs import Child

SESSIONS: dict[str, Session] = {}
MAX_LIVE_SESSIONS = 64
ENDED_TTL_S = 300.0
SEND_TIMEOUT_S = 10.0
MAX_PENDING_INPUT = 1 << 20
MAX_FRAME_BYTES = 256 * 1024
MAX_META_BYTES = 4096
RING_BYTES = {"pty": 64 * 1024, "exec": 1 << 20, "watch": 256 * 1024}
"""A terminal's scrollback; a run's buffered output; a watch's records (see inotify.py)."""
PREFIX = {"pty": "term_", "exec": "run_", "watch": "watch_"}


def frame(kind: bytes, payload: bytes) -> bytes:
    return kind + len(payload).to_bytes(4, "big") + payload


def _set_winsize(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class _Client:
    __slots__ = ("conn", "inbox", "done", "since", "pass_fd")

    def __init__(self, conn: Any, inbox: bytes, since: int, pass_fd: bool = False) -> None:
        self.conn = conn
        self.inbox = inbox
        self.since = since
        self.pass_fd = pass_fd
        self.done = Event()


class Session:
    def __init__(self, req: dict) -> None:
        kind = req.get("kind")
        if kind not in RING_BYTES:
            raise AgentError("invalid_request", "kind must be 'pty', 'exec' or 'watch'")
        env = child_env(req.get("env"))
        if kind == "watch":  # the agent's own watcher (inotify.py), hidden from listings
            lex, real = resolve(req.get("path") or ".")
            if not os.path.isdir(real):
                if os.path.lexists(real):
                    raise AgentError("file_conflict", "not a directory: " + str(req["path"]))
                raise AgentError("file_not_found", "no such directory: " + str(req.get("path")))
            recursive = "1" if req.get("recursive", True) else "0"
            req = {
                **req,
                "argv": [sys.executable, "-I", "-S", sys.argv[0], "--watch", lex, recursive],
            }
            env[INTERNAL_MARK] = "1"
        argv = req.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise AgentError("invalid_request", "argv must be a list of strings")
        meta = req.get("meta") or {}
        if not isinstance(meta, dict) or len(json_dumps(meta)) > MAX_META_BYTES:
            raise AgentError("invalid_request", "meta must be a small object")
        self.kind: str = kind
        self.id = PREFIX[kind] + os.urandom(8).hex()
        self.meta = meta
        self.cols = max(2, min(int(req.get("cols", 80)), 1000))
        self.rows = max(1, min(int(req.get("rows", 24)), 500))
        timeout = req.get("timeout_s")
        self.started = time.monotonic()
        self.created_at = time.time()
        self.deadline = self.started + float(timeout) if timeout else None
        orphan = req.get("orphan_s")
        self.orphan_s = float(orphan) if orphan else None
        self.orphan_deadline: float | None = None
        self.ring: deque[tuple[int, bytes, bytes]] = deque()
        self.ring_bytes = 0
        self.ring_limit = RING_BYTES[kind]
        self.offset = 0
        self.clients: dict[int, _Client] = {}
        self.joining: list[_Client] = []
        self.result: dict | None = None
        self.ended_at = 0.0
        self.lock = _thread.allocate_lock()
        self.ctrl_r, self.ctrl_w = os.pipe()
        self.wake_r, self.wake_w = os.pipe()
        self.outputs: dict[int, bytes] = {}
        self.stdin_fd = -1
        self.pending = b""
        self.stdin_open = True
        self.killed = False
        cwd = req.get("cwd") or WORKSPACE
        try:
            self.child = self._spawn(argv, env, cwd)
        except BaseException:
            for fd in (self.ctrl_r, self.ctrl_w, self.wake_r, self.wake_w, *self.outputs):
                os.close(fd)
            if self.stdin_fd >= 0:
                os.close(self.stdin_fd)
            raise
        remember(self.child)

    def _spawn(self, argv: list[str], env: dict[str, str], cwd: str) -> Child:
        if self.kind == "pty":
            env.setdefault("TERM", "xterm-256color")
            master, slave = os.openpty()
            self.outputs[master] = b"O"
            self.stdin_fd = -1  # input goes to the master (an output fd too)
            try:
                _set_winsize(master, self.cols, self.rows)
                return spawn(
                    argv, env, cwd, (slave, slave, slave), kind="pty",
                    command=" ".join(argv), tty=True, wake_w=self.wake_w,
                )  # fmt: skip
            finally:
                os.close(slave)
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        self.outputs[out_r] = b"O"
        self.outputs[err_r] = b"E"
        self.stdin_fd = in_w
        try:
            return spawn(
                argv, env, cwd, (in_r, out_w, err_w), kind=self.kind,
                command=" ".join(argv), wake_w=self.wake_w,
            )  # fmt: skip
        finally:
            for fd in (in_r, out_w, err_w):
                os.close(fd)

    @property
    def master(self) -> int:
        return next(iter(self.outputs)) if self.kind == "pty" and self.outputs else -1

    def info(self) -> dict:
        code = None
        if self.result is not None:
            code = self.result.get("exit_code")
        return {
            "id": self.id,
            "kind": self.kind,
            "pid": self.child.pid,
            "command": self.child.command,
            "cols": self.cols,
            "rows": self.rows,
            "created_at": self.created_at,
            "running": self.result is None,
            "exit_code": code,
            "clients": len(self.clients),
            "offset": self.offset,
            "meta": self.meta,
        }

    # -- called from request threads ---------------------------------------------------

    def join(self, conn: Any, inbox: bytes, since: int, pass_fd: bool = False) -> None:
        """Hand `conn` to the session's thread and wait until it is done with it."""
        client = _Client(conn, inbox, since, pass_fd)
        conn.settimeout(SEND_TIMEOUT_S)
        with self.lock:
            if self.result is not None:
                self._replay(client, since)
                return
            self.joining.append(client)
            # Under the lock: the session closes this pipe only once its result is set.
            os.write(self.ctrl_w, b"j")
        client.done.wait()

    def kill(self) -> None:
        with self.lock:
            if self.result is not None:
                return
            self.killed = True
            os.write(self.ctrl_w, b"k")

    def resize_from_request(self, cols: int, rows: int) -> bool:
        """Resize from a request thread; False once the terminal has ended (its master may
        be closed, and its number reused, only under the lock once the result is set)."""
        with self.lock:
            if self.result is not None:
                return False
            self._resize(cols, rows)
            return True

    # -- the session's thread ----------------------------------------------------------

    def _replay(self, client: _Client, since: int) -> None:
        """The reply line, the buffered output from `since`, and the end if it ended."""
        first = self.ring[0][0] if self.ring else self.offset
        start = max(since, first)
        # A terminal's client may take the PTY master along (SCM_RIGHTS) to write its input
        # straight to it: keystrokes skip this thread, output still comes from here.
        master = self.master if client.pass_fd and self.result is None else -1
        head = {"ok": True, **self.info(), "from": start, "fd": master >= 0}
        line = json_dumps(head).encode() + b"\n"
        parts = []
        for offset, kind, data in self.ring:
            if offset + len(data) <= start:
                continue
            parts.append(frame(kind, data[max(0, start - offset) :]))
        if self.result is not None:
            parts.append(frame(b"X", json_dumps(self.result).encode()))
        try:
            if master >= 0:
                fds = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, master.to_bytes(4, sys.byteorder))]
                sent = client.conn.sendmsg([line], fds)
                line = line[sent:]
            client.conn.sendall(line + b"".join(parts))
        except OSError:
            pass
        if self.result is not None:
            client.done.set()

    def _append(self, kind: bytes, data: bytes) -> None:
        self.ring.append((self.offset, kind, data))
        self.offset += len(data)
        self.ring_bytes += len(data)
        while self.ring_bytes > self.ring_limit and len(self.ring) > 1:
            self.ring_bytes -= len(self.ring.popleft()[2])

    def run(self) -> None:
        poller = self._poller = select.poll()
        for fd in (*self.outputs, self.ctrl_r, self.wake_r):
            poller.register(fd, select.POLLIN)
        if self.stdin_fd >= 0:
            os.set_blocking(self.stdin_fd, False)
        for fd in self.outputs:
            os.set_blocking(fd, False)
        exit_deadline: float | None = None
        timed_out = False
        try:
            while True:
                now = time.monotonic()
                if self.killed:
                    break
                if self.deadline is not None and now >= self.deadline:
                    timed_out = True
                    break
                if self.orphan_deadline is not None and now >= self.orphan_deadline:
                    break
                if self.child.done.is_set():
                    if exit_deadline is None:
                        exit_deadline = now + IDLE_AFTER_EXIT_S
                    if not self.outputs or now >= exit_deadline:
                        break
                limits = [
                    t for t in (self.deadline, self.orphan_deadline, exit_deadline) if t is not None
                ]
                wait = max(0.0, min(limits) - now) * 1000 if limits else None
                for fd, ev in poller.poll(wait):
                    if fd in self.outputs:
                        if ev & select.POLLOUT:
                            self._flush_input()
                        if ev & ~select.POLLOUT:
                            got = self._read_output(fd)
                            if got and exit_deadline is not None:
                                exit_deadline = time.monotonic() + IDLE_AFTER_EXIT_S
                            if fd not in self.outputs:
                                poller.unregister(fd)
                    elif fd == self.ctrl_r:
                        os.read(self.ctrl_r, 64)
                        self._take_joining(poller)
                    elif fd == self.wake_r:
                        os.read(self.wake_r, 64)
                        poller.unregister(self.wake_r)
                    elif fd == self.stdin_fd:
                        self._flush_input()
                    else:
                        self._from_client(fd)
        finally:
            self._finish(timed_out)

    def _read_output(self, fd: int) -> bool:
        """Read what `fd` has now and send it as one frame. A PTY hands out at most ~4 KB
        per read: reading again until it has nothing (up to MAX_FRAME_BYTES) turns a flood into
        few large frames, and a lone keystroke's echo still leaves after one read."""
        chunks = []
        ended = False
        total = 0
        while total < MAX_FRAME_BYTES:
            try:
                data = os.read(fd, CHUNK)
            except BlockingIOError:
                break
            except OSError:  # EIO: the terminal's last holder is gone
                data = b""
            if not data:
                ended = True
                break
            chunks.append(data)
            total += len(data)
        if chunks:
            data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            kind = self.outputs[fd]
            self._append(kind, data)
            self._broadcast(frame(kind, data))
        if ended:
            del self.outputs[fd]
        return bool(chunks)

    def _broadcast(self, data: bytes) -> None:
        for fd, client in list(self.clients.items()):
            try:
                client.conn.sendall(data)
            except OSError:  # gone, or not reading for SEND_TIMEOUT_S
                self._last_frames(fd, client)
                self._drop(fd)

    def _last_frames(self, fd: int, client: _Client) -> None:
        """What a client sent before it went, still unread: a link that hands over one frame
        and closes (a close of stdin, a signal, keystrokes from another web process) is gone
        when output is next written to it, and its frame must not be lost with it."""
        while fd in self.clients:
            try:
                data = client.conn.recv(CHUNK, socket.MSG_DONTWAIT)
            except OSError:
                return
            if not data:
                return
            self._frames(fd, client, data)

    def _take_joining(self, poller: select.poll) -> None:
        with self.lock:
            joining, self.joining = self.joining, []
        for client in joining:
            self._replay(client, client.since)
            fd = client.conn.fileno()
            self.clients[fd] = client
            poller.register(fd, select.POLLIN)
            self.orphan_deadline = None
            if client.inbox:
                self._frames(fd, client, b"")

    def _drop(self, fd: int) -> None:
        client = self.clients.pop(fd, None)
        if client is None:
            return
        # Always out of the poll set: its socket is closed once `done` is set, and a closed
        # descriptor left in it is reported at once on every poll (POLLNVAL), a busy loop.
        if self._poller is not None:
            try:
                self._poller.unregister(fd)
            except KeyError:
                pass
        client.done.set()
        if not self.clients and self.orphan_s is not None and self.result is None:
            self.orphan_deadline = time.monotonic() + self.orphan_s

    def _from_client(self, fd: int) -> None:
        client = self.clients.get(fd)
        if client is None:
            return
        try:
            data = client.conn.recv(CHUNK)
        except OSError:
            data = b""
        if not data:
            self._drop(fd)
            return
        self._frames(fd, client, data)

    def _frames(self, fd: int, client: _Client, data: bytes) -> None:
        inbox = client.inbox + data
        while len(inbox) >= 5:
            size = int.from_bytes(inbox[1:5], "big")
            if size > CHUNK * 4:
                self._drop(fd)
                return
            if len(inbox) < 5 + size:
                break
            kind, payload, inbox = inbox[:1], inbox[5 : 5 + size], inbox[5 + size :]
            self._command(kind, payload)
        client.inbox = inbox

    def _command(self, kind: bytes, payload: bytes) -> None:
        if kind == b"I":
            self._input(payload)
        elif kind == b"R" and self.kind == "pty":
            try:
                cols, rows = (int(x) for x in payload.split())
                self._resize(cols, rows)
            except (ValueError, OSError):
                pass
        elif kind == b"Q":  # a client ends the session (a cancelled run, a closed watch)
            self.killed = True
        elif kind == b"C" and self.kind == "exec":
            self.stdin_open = False
            if not self.pending and self.stdin_fd >= 0:
                os.close(self.stdin_fd)
                self.stdin_fd = -1
        elif kind == b"K":
            try:
                os.killpg(self.child.pid, int(payload or b"9"))
            except (OSError, ValueError):
                pass

    def _resize(self, cols: int, rows: int) -> None:
        self.cols = max(2, min(cols, 1000))
        self.rows = max(1, min(rows, 500))
        if self.master >= 0:
            _set_winsize(self.master, self.cols, self.rows)

    def _input(self, data: bytes) -> None:
        target = self.master if self.kind == "pty" else self.stdin_fd
        if target < 0 or not self.stdin_open:
            return
        if self.pending:
            if len(self.pending) < MAX_PENDING_INPUT:
                self.pending += data
            return
        try:
            n = os.write(target, data)
        except BlockingIOError:
            n = 0
        except OSError:
            return
        self.pending = data[n:]
        if self.pending:
            self._poller_out(target, True)

    _poller: select.poll | None = None

    def _poller_out(self, fd: int, on: bool) -> None:
        """Wait for `fd` to take the input backlog (or stop waiting)."""
        poller = self._poller
        if poller is None:
            return
        if fd in self.outputs:
            poller.modify(fd, select.POLLIN | (select.POLLOUT if on else 0))
        elif on:
            poller.register(fd, select.POLLOUT)
        else:
            poller.unregister(fd)

    def _flush_input(self) -> None:
        target = self.master if self.kind == "pty" else self.stdin_fd
        try:
            n = os.write(target, self.pending) if target >= 0 else len(self.pending)
        except BlockingIOError:
            return
        except OSError:
            n = len(self.pending)
        self.pending = self.pending[n:]
        if not self.pending:
            self._poller_out(target, False)
            if not self.stdin_open and self.stdin_fd >= 0:
                os.close(self.stdin_fd)
                self.stdin_fd = -1

    def _finish(self, timed_out: bool) -> None:
        child = self.child
        if not child.done.is_set() or self.kind == "pty":
            # A terminal that ends takes its background jobs with it (as a hangup would).
            kill_tree(child.pid, child.tag)
            child.done.wait(2.0)
        for fd in list(self.outputs):
            while True:  # what the child wrote before it ended
                try:
                    data = os.read(fd, CHUNK)
                except OSError:
                    break
                if not data:
                    break
                self._append(self.outputs[fd], data)
                self._broadcast(frame(self.outputs[fd], data))
        code = -9 if timed_out or (self.killed and child.exit_code is None) else child.exit_code
        result = {
            "exit_code": code,
            "timed_out": timed_out,
            "duration_ms": (time.monotonic() - self.started) * 1000,
        }
        with self.lock:
            self.result = result
            self.ended_at = time.monotonic()
            joining, self.joining = self.joining, []
            for fd in (*self.outputs, self.ctrl_r, self.ctrl_w):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self.outputs.clear()
        self._broadcast(frame(b"X", json_dumps(result).encode()))
        for client in [*self.clients.values(), *joining]:
            if client in joining:
                self._replay(client, client.since)
            client.done.set()
        self.clients.clear()
        child.wake_w = None
        for fd in (self.wake_r, self.wake_w):
            os.close(fd)
        if self.stdin_fd >= 0:
            os.close(self.stdin_fd)
            self.stdin_fd = -1


def _forget_ended() -> None:
    now = time.monotonic()
    with TRACK_LOCK:
        for sid, session in list(SESSIONS.items()):
            if session.result is not None and now - session.ended_at > ENDED_TTL_S:
                del SESSIONS[sid]


def _get(req: dict) -> Session:
    session = SESSIONS.get(str(req.get("id")))
    if session is None:
        raise AgentError("process_not_found", "no such session")
    return session


def op_session_open(conn: socket.socket, req: dict) -> None:
    """Start a session; ``attach: true`` keeps this connection as its first client
    (the reply line then comes from the attach, with the session's fields)."""
    _forget_ended()
    live = sum(1 for s in SESSIONS.values() if s.result is None)
    if live >= MAX_LIVE_SESSIONS:
        raise AgentError("resource_exhausted", f"{live} sessions are running")
    session = Session(req)
    with TRACK_LOCK:
        SESSIONS[session.id] = session
    _thread.start_new_thread(session.run, ())
    if req.get("attach"):
        session.join(conn, _prefix(conn), 0)
    else:
        send_line(conn, {"ok": True, **session.info()})


def op_session_attach(conn: socket.socket, req: dict) -> None:
    session = _get(req)
    since = max(0, int(req.get("since", 0)))
    session.join(conn, _prefix(conn), since, bool(req.get("pass_fd")) and session.kind == "pty")


def op_session_list(conn: socket.socket, req: dict) -> None:
    _forget_ended()
    kind = req.get("kind")
    sessions = sorted(SESSIONS.values(), key=lambda s: s.created_at)
    send_line(
        conn,
        {"ok": True, "sessions": [s.info() for s in sessions if kind in (None, s.kind)]},
    )


def op_session_kill(conn: socket.socket, req: dict) -> None:
    """Kill a session's process tree; replies once it has ended (or 2 s later)."""
    session = _get(req)
    session.kill()
    deadline = time.monotonic() + 2.0
    while session.result is None and time.monotonic() < deadline:
        time.sleep(0.005)
    with TRACK_LOCK:  # killed on purpose: not listed as ended (a shell that exits is)
        SESSIONS.pop(session.id, None)
    send_line(conn, {"ok": True, **session.info()})


def op_session_resize(conn: socket.socket, req: dict) -> None:
    session = _get(req)
    if session.kind != "pty" or not session.resize_from_request(int(req["cols"]), int(req["rows"])):
        raise AgentError("process_not_found", "the terminal has ended")
    send_line(conn, {"ok": True, **session.info()})


def _prefix(conn: Any) -> bytes:
    """Bytes a client sent right behind its request line (see server._Prefixed)."""
    rest = getattr(conn, "_rest", b"")
    if rest:
        conn._rest = b""
    return rest


OPS = {
    "session_open": op_session_open,
    "session_attach": op_session_attach,
    "session_list": op_session_list,
    "session_kill": op_session_kill,
    "session_resize": op_session_resize,
}
