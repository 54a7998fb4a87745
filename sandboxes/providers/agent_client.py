"""The host end of the agent protocol (sandboxes/agent/): reply parsing, and the
terminal, port-stream and streamed-command sessions every agent-backed provider returns.

Everything the agent sends is treated as untrusted (the sandbox's own code can
replace the agent): lines and payloads are bounded, replies must be JSON objects.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import socket
import stat
import struct
import termios
import time
from collections.abc import Callable

from sandboxes.providers.base import (
    ExecEvent,
    FileConflict,
    FileNotFound,
    FileTooLarge,
    InvalidRequest,
    PathNotAllowed,
    ProcessNotFound,
    ProviderError,
    ResourceExhausted,
    SandboxGone,
)

_ERRORS: dict[str, type[ProviderError]] = {
    "file_not_found": FileNotFound,
    "path_not_allowed": PathNotAllowed,
    "file_conflict": FileConflict,
    "file_too_large": FileTooLarge,
    "process_not_found": ProcessNotFound,
    "invalid_request": InvalidRequest,
    "resource_exhausted": ResourceExhausted,
}
_MAX_STREAM_FRAME = 1 << 20
"""The agent sends at most 64 KiB per output frame; anything larger is not our agent."""
_MAX_REPLY_LINE = 4 * 1024 * 1024
PTY_WRITE_TIMEOUT_S = 10.0
"""How long a terminal write may wait for the shell to take its input (as docker's)."""
PTY_CLOSE_WAIT_S = 2.0
"""How long close() waits for the agent to confirm the shell's tree is gone."""
_MAX_FDS = 4
"""Room for descriptors in a reply; more than one is refused anyway."""
_MAX_STATUS_BYTES = 4096
_TIOCGPTN = getattr(termios, "TIOCGPTN", None)
if _TIOCGPTN is None and os.uname().machine in ("x86_64", "aarch64", "armv7l", "riscv64", "s390x"):
    _TIOCGPTN = 0x80045430  # _IOR('T', 0x30, unsigned int): answered by PTY masters only


def read_line(sock: socket.socket) -> bytes:
    """One reply line, leaving whatever follows it in the socket (MSG_PEEK)."""
    line = bytearray()
    while True:
        data = sock.recv(65536, socket.MSG_PEEK)
        if not data:
            raise ConnectionResetError("the sandbox agent closed the connection")
        idx = data.find(b"\n")
        take = len(data) if idx < 0 else idx + 1
        line += recv_exact(sock, take)
        if idx >= 0:
            return bytes(line[:-1])
        if len(line) > _MAX_REPLY_LINE:
            raise ValueError("reply line too long")


def reply(sock: socket.socket) -> dict:
    reply = json.loads(read_line(sock))
    if not isinstance(reply, dict):
        raise ValueError("malformed reply")
    if reply.get("ok"):
        return reply
    error = _ERRORS.get(str(reply.get("error")), ProviderError)
    raise error(str(reply.get("message", ""))[:1000])


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionResetError("the sandbox agent closed the connection")
        got += k
    return bytes(buf)


def pty_reply(sock: socket.socket) -> tuple[dict, int | None]:
    """The reply line of a ``pty`` request and the PTY master descriptor attached to it.

    Reads exactly the line (what follows stays in the socket, as with reply()), with
    recvmsg so that descriptors arrive close-on-exec (MSG_CMSG_CLOEXEC) and never leak
    to children. The peer may be hostile: anything but a single descriptor that is a
    PTY master is closed and refused. Returns (reply, None) when none was attached.
    """
    fds: list[int] = []
    truncated = False
    line = bytearray()
    try:
        while True:
            peek = sock.recv(65536, socket.MSG_PEEK)
            if not peek:
                raise ConnectionResetError("the sandbox agent closed the connection")
            idx = peek.find(b"\n")
            want = len(peek) if idx < 0 else idx + 1
            while want:
                data, ancdata, flags, _ = sock.recvmsg(
                    want, socket.CMSG_SPACE(_MAX_FDS * 4), socket.MSG_CMSG_CLOEXEC
                )
                for level, kind, payload in ancdata:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        usable = len(payload) - len(payload) % 4
                        fds.extend(struct.unpack(f"{usable // 4}i", payload[:usable]))
                truncated |= bool(flags & socket.MSG_CTRUNC)
                if not data:
                    raise ConnectionResetError("the sandbox agent closed the connection")
                line += data
                want -= len(data)
            if idx >= 0:
                break
            if len(line) > _MAX_REPLY_LINE:
                raise ValueError("reply line too long")
        body = json.loads(bytes(line[:-1]))
        if not isinstance(body, dict):
            raise ValueError("malformed reply")
        if not body.get("ok"):
            error = _ERRORS.get(str(body.get("error")), ProviderError)
            raise error(str(body.get("message", ""))[:1000])
        if truncated or len(fds) > 1:
            raise ProviderError("the sandbox agent sent unexpected descriptors")
        if fds:
            check_pty_master(fds[0])
        return body, (fds[0] if fds else None)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def check_pty_master(fd: int) -> None:
    """Raise ProviderError unless `fd` is the master side of a pseudo-terminal."""
    try:
        if not stat.S_ISCHR(os.fstat(fd).st_mode) or not os.isatty(fd):
            raise ProviderError("the sandbox agent sent a descriptor that is not a terminal")
        if _TIOCGPTN is not None:
            fcntl.ioctl(fd, _TIOCGPTN, b"\0\0\0\0")  # fails on a slave or any other tty
    except OSError:
        raise ProviderError(
            "the sandbox agent sent a descriptor that is not a PTY master"
        ) from None


class AgentPtySession:
    """A terminal inside the jail whose PTY master the host holds (passed by the agent).

    The shell, its controlling terminal and the PTY's devpts all live inside the jail;
    the host only holds the master: bytes in and out and the window size. The agent
    connection stays open as the control channel: the agent writes the shell's exit
    status there, and closing it makes the agent kill the shell's process tree.
    """

    write_timeout_s = PTY_WRITE_TIMEOUT_S

    def __init__(self, master_fd: int, control: socket.socket, pid: int) -> None:
        os.set_blocking(master_fd, False)
        control.setblocking(False)
        self._fd = master_fd
        self._hangup = select.poll()
        self._hangup.register(master_fd, 0)  # reports POLLHUP only: nothing holds the slave
        self._control = control
        self.pid = pid
        self._closed = False
        self._status = bytearray()
        self._exit_code: int | None = None
        self._agent_gone = False

    def fileno(self) -> int:
        return self._fd

    def read(self, max_bytes: int = 65536) -> bytes:
        """Non-blocking: raises BlockingIOError when nothing is ready, b"" at the end
        (the PTY answers EIO once nothing in the jail holds the terminal any more)."""
        if self._closed:
            return b""
        try:
            return os.read(self._fd, max_bytes)
        except BlockingIOError:
            raise
        except OSError:
            return b""

    def write(self, data: bytes) -> None:
        """Send keystrokes. Raises SandboxGone once the terminal or its sandbox has
        ended, ProviderError when the shell takes no input for `write_timeout_s`."""
        if self._closed:
            raise SandboxGone("the terminal is closed")
        if self._hangup.poll(0):  # the master takes input even when nothing can read it
            raise SandboxGone("the terminal has ended")
        view = memoryview(data)
        deadline = None
        while view:
            try:
                n = os.write(self._fd, view)
            except BlockingIOError:
                n = 0
            except OSError:
                raise SandboxGone("the terminal has ended") from None
            if n:
                view = view[n:]
                continue
            now = time.monotonic()
            if deadline is None:
                deadline = now + self.write_timeout_s
            if now >= deadline:
                raise ProviderError("the terminal is not accepting input")
            poller = select.poll()
            poller.register(self._fd, select.POLLOUT)
            poller.poll(min(deadline - now, 0.05) * 1000)

    def resize(self, cols: int, rows: int) -> None:
        """Set the window size on the master: the kernel sends SIGWINCH to the terminal's
        foreground process group inside the jail. No round trip to the agent."""
        if self._closed:
            raise SandboxGone("the terminal is closed")
        try:
            fcntl.ioctl(self._fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        except OSError:
            raise SandboxGone("the terminal has ended") from None

    def exit_code(self) -> int | None:
        """The shell's exit status once the agent reported it; None while it runs, -9 when
        the agent went away without saying (the sandbox was destroyed)."""
        if self._exit_code is None and not self._closed:
            self._pump(0.0)
        if self._exit_code is not None:
            return self._exit_code
        return -9 if self._agent_gone or self._closed else None

    def _pump(self, timeout: float, *, until_eof: bool = False) -> None:
        """Read the control connection: the agent writes one status line when the shell
        exits and closes its end when it is done with the terminal."""
        deadline = time.monotonic() + timeout
        while not self._agent_gone and (until_eof or self._exit_code is None):
            try:
                data = self._control.recv(_MAX_STATUS_BYTES)
            except BlockingIOError:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                poller = select.poll()
                poller.register(self._control.fileno(), select.POLLIN)
                poller.poll(remaining * 1000)
                continue
            except OSError:
                data = b""
            if not data:
                self._agent_gone = True
                return
            if self._exit_code is None:
                self._status += data
                if b"\n" in self._status:
                    self._exit_code = _status_code(bytes(self._status.partition(b"\n")[0]))
                elif len(self._status) > _MAX_STATUS_BYTES:
                    self._exit_code = -9

    def close(self) -> None:
        """Kill the shell's process tree - the agent does it when the connection closes,
        and we wait (briefly) for it to confirm - then drop the master. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._control.shutdown(socket.SHUT_WR)
            self._pump(PTY_CLOSE_WAIT_S, until_eof=True)
        except OSError:
            pass
        finally:
            self._control.close()
            os.close(self._fd)


def _status_code(line: bytes) -> int:
    try:
        code = json.loads(line).get("exit_code")
    except (ValueError, AttributeError):
        return -9
    return code if isinstance(code, int) and not isinstance(code, bool) else -9


class AgentRelayPtySession:
    """A terminal whose bytes the agent relays over its connection: the fallback when
    the PTY master could not be passed to the host."""

    write_timeout_s = PTY_WRITE_TIMEOUT_S

    def __init__(self, control: Callable[[dict], dict], sock: socket.socket, pid: int) -> None:
        self._control = control
        self._sock = sock
        self.pid = pid
        self._closed = False

    def fileno(self) -> int:
        return self._sock.fileno()

    def read(self, max_bytes: int = 65536) -> bytes:
        """Non-blocking: raises BlockingIOError when nothing is ready, b"" at the end."""
        if self._closed:
            return b""
        try:
            return self._sock.recv(max_bytes)
        except ConnectionResetError:
            return b""

    def write(self, data: bytes) -> None:
        """Send keystrokes. Raises SandboxGone once the terminal or its sandbox has
        ended, ProviderError when the shell takes no input for `write_timeout_s`."""
        if self._closed:
            raise SandboxGone("the terminal is closed")
        view = memoryview(data)
        deadline = time.monotonic() + self.write_timeout_s
        while view:
            try:
                view = view[self._sock.send(view) :]
            except BlockingIOError:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ProviderError("the terminal is not accepting input") from None
                poller = select.poll()
                poller.register(self._sock.fileno(), select.POLLOUT)
                poller.poll(remaining * 1000)
            except (BrokenPipeError, ConnectionResetError):
                raise SandboxGone("the terminal has ended") from None

    def resize(self, cols: int, rows: int) -> None:
        self._control(
            {"op": "pty_resize", "pid": self.pid, "cols": int(cols), "rows": int(rows)},
        )

    def exit_code(self) -> int | None:
        try:
            reply = self._control({"op": "pty_status", "pid": self.pid})
        except (ProcessNotFound, SandboxGone):
            return -9
        code = reply.get("exit_code")
        return None if code is None else int(code)

    def close(self) -> None:
        """Closing the connection makes the agent kill the shell's process tree."""
        if not self._closed:
            self._closed = True
            self._sock.close()


class AgentPortStream:
    """A TCP connection inside the jail, relayed by the agent over a Unix socket."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def fileno(self) -> int:
        return self._sock.fileno()

    def recv(self, max_bytes: int = 65536) -> bytes:
        return self._sock.recv(max_bytes)

    def sendall(self, data: bytes) -> None:
        self._sock.sendall(data)

    def close(self) -> None:
        self._sock.close()


class AgentExecStream:
    """A command started by the agent's ``exec_stream``: frames over its connection
    (see sandboxes/agent/execute.py). Closing the connection kills the command's tree."""

    def __init__(self, sock: socket.socket, pid: int) -> None:
        sock.setblocking(False)
        self._sock = sock
        self.pid = pid
        self._inbox = bytearray()
        self._ended = False

    def fileno(self) -> int:
        return self._sock.fileno()

    def read_events(self) -> list[ExecEvent]:
        """What has arrived (non-blocking): raises BlockingIOError when nothing has; the
        last event is ``exit`` (with ``exit_code`` None when the agent went away)."""
        if self._ended:
            return []
        try:
            data = self._sock.recv(262144)
        except BlockingIOError:
            raise
        except OSError:
            data = b""
        if not data:
            self._ended = True
            return [ExecEvent("exit")]
        self._inbox += data
        events: list[ExecEvent] = []
        while len(self._inbox) >= 5:
            size = int.from_bytes(self._inbox[1:5], "big")
            if size > _MAX_STREAM_FRAME:
                self._ended = True
                return [*events, ExecEvent("exit")]
            if len(self._inbox) < 5 + size:
                break
            kind = bytes(self._inbox[:1])
            payload = bytes(self._inbox[5 : 5 + size])
            del self._inbox[: 5 + size]
            if kind == b"O":
                events.append(ExecEvent("stdout", payload))
            elif kind == b"E":
                events.append(ExecEvent("stderr", payload))
            elif kind == b"X":
                self._ended = True
                events.append(_exit_event(payload))
                break
        return events

    def _send(self, kind: bytes, payload: bytes = b"") -> None:
        if self._ended:
            return
        data = memoryview(kind + len(payload).to_bytes(4, "big") + payload)
        deadline = time.monotonic() + PTY_WRITE_TIMEOUT_S
        while data:
            try:
                data = data[self._sock.send(data) :]
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise ProviderError("the command is not accepting input") from None
                poller = select.poll()
                poller.register(self._sock.fileno(), select.POLLOUT)
                poller.poll(50)
            except OSError:
                return  # the command has ended; its exit event tells the rest

    def write_stdin(self, data: bytes) -> None:
        for start in range(0, len(data), 65536):
            self._send(b"I", data[start : start + 65536])

    def close_stdin(self) -> None:
        self._send(b"C")

    def signal(self, signal: int) -> None:
        self._send(b"K", str(int(signal)).encode())

    def close(self) -> None:
        """Kill the command's process tree (the agent does it when we hang up)."""
        self._ended = True
        self._sock.close()


def _exit_event(payload: bytes) -> ExecEvent:
    try:
        body = json.loads(payload)
        code = body.get("exit_code")
        return ExecEvent(
            "exit",
            exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
            timed_out=bool(body.get("timed_out")),
            duration_ms=float(body.get("duration_ms") or 0.0),
        )
    except (ValueError, AttributeError, TypeError):
        return ExecEvent("exit")


def exec_stream_request(
    argv: list[str], cwd: str | None, env: dict[str, str], timeout_s: float | None
) -> bytes:
    """The ``exec_stream`` request line."""
    return (
        json.dumps(
            {"op": "exec_stream", "argv": argv, "cwd": cwd, "env": env, "timeout_s": timeout_s}
        ).encode()
        + b"\n"
    )
