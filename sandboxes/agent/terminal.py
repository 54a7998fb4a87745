"""Terminals: a PTY and a shell inside the sandbox, its master passed to the host
(SCM_RIGHTS) or relayed over the connection when it cannot be."""

from __future__ import annotations

import os
import select
import sys

from .procs import TRACK_LOCK, TRACKED, Child, child_env, kill_tree, remember, spawn
from .wire import CHUNK, AgentError, json_dumps, send_line, socket

PTY_MASTERS: dict[int, int] = {}


def _set_winsize(fd: int, cols: int, rows: int) -> None:
    import fcntl
    import struct
    import termios

    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def op_pty(conn: socket.socket, req: dict) -> None:
    master, slave = os.openpty()
    _set_winsize(master, int(req.get("cols", 80)), int(req.get("rows", 24)))
    env = child_env(req.get("env"))
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
    remember(child)
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
        send_line(conn, {"ok": True, "pid": child.pid, "mode": "relay"})
        ended = _splice(conn, master)
    finally:
        with TRACK_LOCK:
            PTY_MASTERS.pop(child.pid, None)
        # A closed client means "kill the shell"; an ended terminal means it exited.
        if ended == "client" or not child.done.wait(1.0):
            kill_tree(child.pid, child.tag)
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
                    send_line(conn, {"exit_code": child.exit_code})
                elif not conn.recv(CHUNK):  # the host sends nothing; EOF is close()
                    return True
    except OSError:
        return True
    finally:
        if not child.done.is_set() or _tty_held(tty_path):
            kill_tree(child.pid, child.tag)
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
    send_line(conn, {"ok": True})


def op_pty_status(conn: socket.socket, req: dict) -> None:
    child = TRACKED.get(int(req["pid"]))
    if child is None:
        raise AgentError("process_not_found", "unknown terminal")
    send_line(conn, {"ok": True, "exit_code": child.exit_code})
