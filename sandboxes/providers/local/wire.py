"""The host end of the agent protocol: reply parsing, terminal and port-stream sessions.

Everything the agent sends is treated as untrusted (the sandbox's own code can
replace the agent): lines and payloads are bounded, replies must be JSON objects.
"""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Callable

from sandboxes.providers.base import (
    FileNotFound,
    InvalidRequest,
    ProcessNotFound,
    ProviderError,
    ResourceExhausted,
    SandboxGone,
)

_ERRORS: dict[str, type[ProviderError]] = {
    "file_not_found": FileNotFound,
    "process_not_found": ProcessNotFound,
    "invalid_request": InvalidRequest,
    "resource_exhausted": ResourceExhausted,
}
_MAX_REPLY_LINE = 4 * 1024 * 1024
PTY_WRITE_TIMEOUT_S = 10.0
"""How long a terminal write may wait for the shell to take its input (as docker's)."""


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


class LocalPtySession:
    """A terminal whose bytes flow raw over the agent connection."""

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
                select.select([], [self._sock], [], remaining)
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


class LocalPortStream:
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
