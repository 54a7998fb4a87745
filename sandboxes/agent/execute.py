"""Commands run to completion (``exec``) and streamed (``exec_stream``)."""

from __future__ import annotations

# posix, not os: the agent's start-up skips `os` (see procs.py)
import posix
import select
import time

from .procs import IDLE_AFTER_EXIT_S, WORKSPACE, child_env, kill_tree, spawn
from .wire import CHUNK, json_dumps, socket


def op_exec(conn: socket.socket, req: dict, stdin: bytes) -> None:
    cap = int(req.get("max_output_bytes", 1 << 20))
    timeout = float(req.get("timeout_s", 30.0))
    oom_before = oom_kills()
    started = time.monotonic()
    deadline = started + timeout
    out_r, out_w = posix.pipe()
    err_r, err_w = posix.pipe()
    wake_r, wake_w = posix.pipe()
    if stdin:
        in_r, in_w = posix.pipe()
    else:
        in_r, in_w = posix.open("/dev/null", posix.O_RDONLY), -1
    try:
        child = spawn(
            req["argv"],
            child_env(req.get("env")),
            req.get("cwd") or "/workspace",
            (in_r, out_w, err_w),
            kind="exec",
            command=" ".join(req["argv"]),
            wake_w=wake_w,
        )
    except BaseException:
        for fd in (out_r, err_r, wake_r, wake_w, in_w):
            if fd >= 0:
                posix.close(fd)
        raise
    finally:
        posix.close(in_r)
        posix.close(out_w)
        posix.close(err_w)
    bufs = {out_r: bytearray(), err_r: bytearray()}
    truncated = {out_r: False, err_r: False}
    poller = select.poll()
    poller.register(out_r, select.POLLIN)
    poller.register(err_r, select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    open_fds = {out_r, err_r}
    pending = memoryview(stdin) if stdin else None
    if in_w >= 0:
        posix.set_blocking(in_w, False)
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
                    posix.read(wake_r, 64)
                    poller.unregister(wake_r)
                elif fd == in_w:
                    try:
                        n = posix.write(in_w, pending[:CHUNK]) if pending is not None else 0
                    except (BrokenPipeError, BlockingIOError) as exc:
                        n = 0
                        if isinstance(exc, BrokenPipeError):
                            pending = None
                    if pending is not None:
                        pending = pending[n:]
                    if pending is None or not len(pending):
                        poller.unregister(in_w)
                        posix.close(in_w)
                        in_w = -1
                else:
                    data = posix.read(fd, CHUNK)
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
            kill_tree(child.pid, child.tag)
            child.done.wait(5.0)
    finally:
        for fd in (out_r, err_r, wake_r, wake_w, in_w):
            if fd >= 0:
                try:
                    posix.close(fd)
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
        "oom_killed": not timed_out and child.exit_code == -9 and oom_kills() > oom_before >= 0,
    }
    conn.sendall(json_dumps(reply).encode() + b"\n" + bytes(bufs[out_r]) + bytes(bufs[err_r]))


_OOM_FILES = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")


def oom_kills() -> int:
    """The memory cgroup's OOM-kill count as the sandbox sees it (a container's own
    cgroup); -1 where it cannot be read (a jail: the local provider reads it host-side)."""
    for path in _OOM_FILES:
        try:
            with open(path, "rb") as f:
                for line in f:
                    if line.startswith(b"oom_kill "):
                        return int(line.split()[1])
        except OSError:
            continue
    return -1


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    """One ``exec_stream`` frame: a kind byte, the payload length (4 bytes, big-endian)."""
    return kind + len(payload).to_bytes(4, "big") + payload


def op_exec_stream(conn: socket.socket, req: dict) -> None:
    """Start a command and stream it both ways over this connection.

    Reply ``{"ok": true, "pid": N}``, then frames (see `frame`). From the agent: ``O``
    stdout bytes, ``E`` stderr bytes, and last ``X`` with a JSON object (``exit_code``,
    ``timed_out``, ``duration_ms``). From the host: ``I`` stdin bytes, ``C`` close stdin,
    ``K`` a signal number (ASCII) for the command's process group. The host closing the
    connection kills the command's tree.
    """
    timeout = req.get("timeout_s")
    started = time.monotonic()
    deadline = started + float(timeout) if timeout else None
    in_r, in_w = posix.pipe()
    out_r, out_w = posix.pipe()
    err_r, err_w = posix.pipe()
    wake_r, wake_w = posix.pipe()
    try:
        child = spawn(
            req["argv"],
            child_env(req.get("env")),
            req.get("cwd") or WORKSPACE,
            (in_r, out_w, err_w),
            kind="exec",
            command=" ".join(req["argv"]),
            wake_w=wake_w,
        )
    except BaseException:
        for fd in (in_w, out_r, err_r, wake_r, wake_w):
            posix.close(fd)
        raise
    finally:
        for fd in (in_r, out_w, err_w):
            posix.close(fd)
    conn.sendall(json_dumps({"ok": True, "pid": child.pid}).encode() + b"\n")
    kinds = {out_r: b"O", err_r: b"E"}
    poller = select.poll()
    for fd in (out_r, err_r, wake_r, conn.fileno()):
        poller.register(fd, select.POLLIN)
    posix.set_blocking(in_w, False)
    inbox = b""
    pending = b""
    stdin_open = True
    client_open = True
    timed_out = False
    exit_deadline: float | None = None
    try:
        while kinds or not child.done.is_set():
            now = time.monotonic()
            limits = [t for t in (deadline, exit_deadline) if t is not None]
            if deadline is not None and now >= deadline:
                timed_out = True
                kill_tree(child.pid, child.tag)
                child.done.wait(5.0)
                break
            if exit_deadline is not None and now >= exit_deadline:
                break
            if child.done.is_set() and exit_deadline is None:
                exit_deadline = now + IDLE_AFTER_EXIT_S
                continue
            wait_ms = max(0.0, min(limits) - now) * 1000 if limits else None
            for fd, _ev in poller.poll(wait_ms):
                if fd == wake_r:
                    posix.read(wake_r, 64)
                    poller.unregister(wake_r)
                elif fd in kinds:
                    data = posix.read(fd, CHUNK)
                    if data:
                        conn.sendall(frame(kinds[fd], data))
                        if exit_deadline is not None:
                            exit_deadline = time.monotonic() + IDLE_AFTER_EXIT_S
                    else:
                        poller.unregister(fd)
                        del kinds[fd]
                elif fd == in_w:
                    pending = _flush(in_w, pending)
                    if not pending:
                        poller.unregister(in_w)
                        if not stdin_open:
                            posix.close(in_w)
                            in_w = -1
                else:
                    data = conn.recv(CHUNK)
                    if not data:  # the host went away: kill the command
                        client_open = False
                        return
                    inbox += data
                    while len(inbox) >= 5:
                        size = int.from_bytes(inbox[1:5], "big")
                        if len(inbox) < 5 + size:
                            break
                        kind, payload, inbox = inbox[:1], inbox[5 : 5 + size], inbox[5 + size :]
                        if kind == b"I" and stdin_open and in_w >= 0:
                            had = bool(pending)
                            pending = _flush(in_w, pending + payload)
                            if pending and not had:
                                poller.register(in_w, select.POLLOUT)
                        elif kind == b"C" and stdin_open:
                            stdin_open = False
                            if not pending and in_w >= 0:
                                posix.close(in_w)
                                in_w = -1
                        elif kind == b"K":
                            try:
                                posix.killpg(child.pid, int(payload or b"9"))
                            except (OSError, ValueError):
                                pass
        result = {
            "exit_code": -9 if timed_out else child.exit_code,
            "timed_out": timed_out,
            "duration_ms": (time.monotonic() - started) * 1000,
        }
        conn.sendall(frame(b"X", json_dumps(result).encode()))
    finally:
        if not client_open or not child.done.is_set():
            kill_tree(child.pid, child.tag)
        child.wake_w = None
        for fd in (in_w, out_r, err_r, wake_r, wake_w):
            if fd >= 0:
                try:
                    posix.close(fd)
                except OSError:
                    pass


def _flush(fd: int, data: bytes) -> bytes:
    """Write what the pipe takes now; return the rest (all of it is dropped once the
    command closed its stdin)."""
    try:
        return data[posix.write(fd, data) :] if data else b""
    except BlockingIOError:
        return data
    except OSError:
        return b""
