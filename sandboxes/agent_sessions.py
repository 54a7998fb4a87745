"""The host end of the agent's sessions (sandboxes/agent/sessions.py): terminals and runs
that live in the sandbox, so any web process can list, attach to, type into and kill them.

A provider that runs the agent offers ``agent_socket(provider_id)``: a fresh connection to
the agent (its Unix socket, bind-mounted for docker; a ``docker exec`` relay for remote
engines and gVisor). Control calls here are blocking (call them from a thread); an
attached `SessionLink` is driven from the event loop: ``loop.add_reader`` on its socket,
non-blocking sends, no thread and no channel layer between a keystroke and the shell.

Everything the agent sends is untrusted (code in the sandbox can replace the agent):
reply lines and frames are bounded, ids are checked before they are sent.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import re
import select
import socket
import struct
import termios
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeGuard, runtime_checkable

from .providers.agent_client import AgentExecStream, pty_reply, reply
from .providers.base import ExecEvent, FileEvent, InvalidRequest, ProcessNotFound, ProviderError
from .providers.watch_records import file_events

MAX_FRAME = 1 << 20
MAX_OUTBOX_BYTES = 4 << 20
"""Input a link holds while the agent is not taking it; past this the link fails."""
SESSION_ID = re.compile(r"(term|run|watch)_[0-9a-f]{16}")


@runtime_checkable
class AgentSessions(Protocol):
    """A provider whose sandboxes run the agent (local, docker)."""

    def agent_socket(self, provider_id: str) -> socket.socket: ...


def supports_sessions(provider: object) -> TypeGuard[AgentSessions]:
    return isinstance(provider, AgentSessions)


@dataclass(frozen=True)
class SessionInfo:
    """What the agent says about one session."""

    id: str
    kind: str
    """'pty' (a terminal) or 'exec' (a streamed run)."""
    pid: int
    cols: int
    rows: int
    created_at: float
    running: bool
    exit_code: int | None
    clients: int
    offset: int
    """Bytes of output so far."""
    meta: dict[str, Any]


def _info(body: Mapping[str, Any]) -> SessionInfo:
    try:
        return _parse_info(body)
    except (TypeError, ValueError, AttributeError):
        raise ProviderError("the sandbox agent sent a malformed session") from None


def _parse_info(body: Mapping[str, Any]) -> SessionInfo:
    code = body.get("exit_code")
    meta = body.get("meta")
    return SessionInfo(
        id=str(body.get("id", "")),
        kind=str(body.get("kind", "")),
        pid=int(body.get("pid") or 0),
        cols=int(body.get("cols") or 80),
        rows=int(body.get("rows") or 24),
        created_at=float(body.get("created_at") or 0.0),
        running=bool(body.get("running")),
        exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
        clients=int(body.get("clients") or 0),
        offset=int(body.get("offset") or 0),
        meta=meta if isinstance(meta, dict) else {},
    )


def _reply(sock: socket.socket) -> dict[str, Any]:
    # The agent client's reader: bounded lines, errors mapped to ProviderError types.
    return reply(sock)


def _call(provider: AgentSessions, provider_id: str, request: dict[str, Any]) -> dict[str, Any]:
    sock = provider.agent_socket(provider_id)
    try:
        sock.sendall(json.dumps(request).encode() + b"\n")
        return _reply(sock)
    except (OSError, ValueError) as exc:
        raise ProviderError(f"lost the sandbox agent: {exc!r}") from None
    finally:
        sock.close()


WORKSPACE = "/workspace"


def sandbox_cwd(cwd: str | None) -> str:
    """A working directory in the sandbox: relative ones are under the workspace."""
    if not cwd:
        return WORKSPACE
    return cwd if cwd.startswith("/") else f"{WORKSPACE}/{cwd}"


def check_id(session_id: str) -> str:
    if not isinstance(session_id, str) or not SESSION_ID.fullmatch(session_id):
        raise ProcessNotFound("no such session")
    return session_id


def session_list(
    provider: AgentSessions, provider_id: str, kind: str | None = None
) -> list[SessionInfo]:
    """The sandbox's sessions (of `kind`), oldest first, ended ones for a while too."""
    body = _call(provider, provider_id, {"op": "session_list", "kind": kind})
    rows = body.get("sessions")
    if not isinstance(rows, list):
        return []
    return [_info(row) for row in rows[:1000] if isinstance(row, dict)]


def session_get(provider: AgentSessions, provider_id: str, session_id: str) -> SessionInfo:
    """ProcessNotFound when the agent does not know it."""
    check_id(session_id)
    for info in session_list(provider, provider_id):
        if info.id == session_id:
            return info
    raise ProcessNotFound("no such session")


def session_open(
    provider: AgentSessions,
    provider_id: str,
    *,
    kind: str,
    argv: list[str],
    cwd: str | None,
    env: Mapping[str, str] | None,
    cols: int = 80,
    rows: int = 24,
    timeout_s: float | None = None,
    orphan_s: float | None = None,
    meta: Mapping[str, Any] | None = None,
    attach: bool = False,
    path: str | None = None,
    recursive: bool = True,
) -> tuple[SessionInfo, SessionLink | None]:
    """Start a session in the sandbox; with `attach`, also the link to it (one round trip).
    kind 'pty' (a terminal), 'exec' (a run) or 'watch' (`path`, `recursive`: the agent's
    own watcher; `argv` is ignored). Raises the provider's errors."""
    for value in [*argv, *(env or {}).keys(), *(env or {}).values(), cwd or ""]:
        if "\x00" in value:
            raise InvalidRequest("NUL byte in the command or its environment")
    for key in env or {}:
        if not key or "=" in key:
            raise InvalidRequest(f"Invalid environment variable name: {key!r}")
    request = {
        "op": "session_open",
        "kind": kind,
        "argv": list(argv),
        "cwd": cwd,
        "env": dict(env or {}),
        "cols": int(cols),
        "rows": int(rows),
        "timeout_s": timeout_s,
        "orphan_s": orphan_s,
        "meta": dict(meta or {}),
        "attach": attach,
        "path": path,
        "recursive": recursive,
    }
    sock = provider.agent_socket(provider_id)
    try:
        sock.sendall(json.dumps(request).encode() + b"\n")
        body = _reply(sock)
    except BaseException as exc:
        sock.close()
        if isinstance(exc, (OSError, ValueError)):
            raise ProviderError(f"lost the sandbox agent: {exc!r}") from None
        raise
    info = _info(body)
    if not attach:
        sock.close()
        return info, None
    return info, SessionLink(sock, info, int(body.get("from") or 0))


def session_attach(
    provider: AgentSessions, provider_id: str, session_id: str, since: int = 0
) -> SessionLink:
    """Attach to a session: the link first yields its buffered output from byte `since`
    (as much as the agent still holds), then live output. ProcessNotFound when unknown.

    A terminal's link also asks for the PTY master (passed with SCM_RIGHTS where the
    agent's socket is reachable; not through a docker-exec relay) and writes keystrokes
    straight to it, so input skips a hop through the agent; output still comes from the
    agent, which alone reads the PTY (for every client and the scrollback)."""
    check_id(session_id)
    sock = provider.agent_socket(provider_id)
    fd = None
    try:
        request = {
            "op": "session_attach",
            "id": session_id,
            "since": max(0, int(since)),
            "pass_fd": session_id.startswith("term_"),
        }
        sock.sendall(json.dumps(request).encode() + b"\n")
        body, fd = pty_reply(sock)  # checks a descriptor is a PTY master; none is fine
        return SessionLink(sock, _info(body), int(body.get("from") or 0), input_fd=fd)
    except BaseException as exc:
        sock.close()
        if fd is not None:
            os.close(fd)
        if isinstance(exc, (OSError, ValueError)):
            raise ProviderError(f"lost the sandbox agent: {exc!r}") from None
        raise


def session_kill(provider: AgentSessions, provider_id: str, session_id: str) -> SessionInfo:
    """Kill the session's process tree; its clients get its end."""
    check_id(session_id)
    return _info(_call(provider, provider_id, {"op": "session_kill", "id": session_id}))


def session_resize(
    provider: AgentSessions, provider_id: str, session_id: str, cols: int, rows: int
) -> SessionInfo:
    check_id(session_id)
    request = {"op": "session_resize", "id": session_id, "cols": int(cols), "rows": int(rows)}
    return _info(_call(provider, provider_id, request))


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    return kind + len(payload).to_bytes(4, "big") + payload


class SessionLink:
    """One attached connection, driven from the event loop.

    `start(on_output, on_exit)` reads frames with ``loop.add_reader``: ``on_output(kind,
    data)`` for each ``O``/``E`` frame, then ``on_exit(result)`` once (``None`` when the
    agent went away: the sandbox stopped). Sends never block: what the socket does not
    take now waits for ``add_writer``."""

    def __init__(
        self, sock: socket.socket, info: SessionInfo, start: int, input_fd: int | None = None
    ) -> None:
        sock.setblocking(False)
        self.sock = sock
        self._input_fd = -1 if input_fd is None else input_fd
        """The terminal's PTY master, for input only (see session_attach); -1: frames."""
        if self._input_fd >= 0:  # shared with the agent, which wants it non-blocking too
            os.set_blocking(self._input_fd, False)
        self.info = info
        self.offset = start
        """Output bytes before the next one delivered (a reattach passes it as `since`)."""
        self.ended = False
        self.result: dict[str, Any] | None = None
        self._inbox = bytearray()
        self._outbox: deque[bytes] = deque()
        self._outbox_bytes = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_output: Callable[[bytes, bytes], None] | None = None
        self._on_exit: Callable[[dict[str, Any] | None], None] | None = None
        self._fd = sock.fileno()

    def start(
        self,
        on_output: Callable[[bytes, bytes], None],
        on_exit: Callable[[dict[str, Any] | None], None],
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._on_output = on_output
        self._on_exit = on_exit
        self._loop.add_reader(self._fd, self._on_readable)
        if self._inbox:
            self._loop.call_soon(self._parse)

    def _on_readable(self) -> None:
        try:
            data = self.sock.recv(262144)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._end(None)
            return
        self._inbox += data
        self._parse()

    def _parse(self) -> None:
        inbox = self._inbox
        pos = 0
        while len(inbox) - pos >= 5:
            size = int.from_bytes(inbox[pos + 1 : pos + 5], "big")
            if size > MAX_FRAME:
                self._end(None)
                return
            if len(inbox) - pos < 5 + size:
                break
            kind = bytes(inbox[pos : pos + 1])
            payload = bytes(inbox[pos + 5 : pos + 5 + size])
            pos += 5 + size
            if kind in (b"O", b"E"):
                self.offset += size
                if self._on_output is not None:
                    self._on_output(kind, payload)
            elif kind == b"X":
                try:
                    result = json.loads(payload)
                except ValueError:
                    result = None
                self._end(result if isinstance(result, dict) else {"exit_code": None})
                return
        del inbox[:pos]

    def _end(self, result: dict[str, Any] | None) -> None:
        if self.ended:
            return
        self.ended = True
        self.result = result
        self.close()
        if self._on_exit is not None:
            self._on_exit(result)

    # -- sending -------------------------------------------------------------------------

    def send(self, kind: bytes, payload: bytes = b"") -> None:
        """Queue one frame to the agent (input, resize, close stdin, signal)."""
        if self.ended:
            return
        data = frame(kind, payload)
        if not self._outbox:
            try:
                sent = self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                return  # the read side sees the end
            if sent == len(data):
                return
            data = data[sent:]
            if self._loop is not None:
                self._loop.add_writer(self._fd, self._drain)
        self._outbox.append(data)
        self._outbox_bytes += len(data)
        if self._outbox_bytes > MAX_OUTBOX_BYTES:
            self._end(None)

    def _drain(self) -> None:
        while self._outbox:
            data = self._outbox[0]
            try:
                sent = self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._outbox.clear()
                break
            self._outbox_bytes -= sent
            if sent < len(data):
                self._outbox[0] = data[sent:]
                return
            self._outbox.popleft()
        if self._loop is not None:
            self._loop.remove_writer(self._fd)

    def write(self, data: bytes) -> None:
        if self._input_fd >= 0 and not self._outbox and not self.ended:
            try:
                written = os.write(self._input_fd, data)
            except BlockingIOError:
                written = 0
            except OSError:  # the terminal has ended: its end frame follows
                return
            if written == len(data):
                return
            # The shell is not taking input as fast: the rest, and from now on all input,
            # goes through the agent, which queues it in order.
            data = data[written:]
            self._close_input()
        for start in range(0, len(data), 65536):
            self.send(b"I", data[start : start + 65536])

    def _close_input(self) -> None:
        if self._input_fd >= 0:
            os.close(self._input_fd)
            self._input_fd = -1

    def resize(self, cols: int, rows: int) -> None:
        if self._input_fd >= 0:
            # On the master we write to, so it takes effect before the input that follows
            # (a frame would reach the agent after keystrokes written straight to the PTY).
            try:
                packed = struct.pack("HHHH", int(rows), int(cols), 0, 0)
                fcntl.ioctl(self._input_fd, termios.TIOCSWINSZ, packed)
            except OSError:
                pass
        self.send(b"R", f"{int(cols)} {int(rows)}".encode())  # the agent's record of it

    def close(self) -> None:
        """Detach (the session goes on). Idempotent."""
        if self._loop is not None and self._fd >= 0:
            try:
                self._loop.remove_reader(self._fd)
                self._loop.remove_writer(self._fd)
            except (ValueError, OSError, RuntimeError):
                pass
        self._fd = -1
        self._close_input()
        try:
            self.sock.close()
        except OSError:
            pass


# --- streamed runs and watches over a session (used from threads, like the provider's) ----


class AgentRunStream(AgentExecStream):
    """An ExecStream over an attached ``exec`` session: the provider's frames (O, E, X; I,
    C, K), plus what reattaching needs. Closing ends the run (a ``Q`` frame) unless it has
    ended; a web process that dies without closing leaves it to the agent's orphan rule."""

    def __init__(self, link: SessionLink) -> None:
        super().__init__(link.sock, link.info.pid)
        self.session_id = link.info.id
        self.offset = link.offset
        """Output bytes (stdout and stderr) before the next event."""

    def read_events(self) -> list[ExecEvent]:
        events = super().read_events()
        for event in events:
            if event.type in ("stdout", "stderr"):
                self.offset += len(event.data)
        return events

    def close(self) -> None:
        if not self._ended:
            self._send(b"Q")
        super().close()

    def detach(self) -> None:
        """Hang up and leave the run going (for its orphan time, or for good when it was
        started detached)."""
        super().close()


class AgentWatch:
    """Batches of FileEvents from an attached ``watch`` session (blocking: iterate in a
    thread); `offset` is the position after the last batch returned, for a reattach.
    Closing ends the watch (``Q``); `detach()` leaves it running."""

    def __init__(self, link: SessionLink, batch_s: float = 0.05) -> None:
        self._sock = link.sock
        self._sock.setblocking(True)
        self.session_id = link.info.id
        self.offset = link.offset
        self._consumed = link.offset
        self._frames = bytearray()
        self._records = b""
        self._batch_s = batch_s
        self._closed = False

    def __iter__(self) -> AgentWatch:
        return self

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Until the watcher has its watches in place (its first, empty record)."""
        deadline = time.monotonic() + timeout
        while b"\0" not in self._records:
            left = deadline - time.monotonic()
            if left <= 0 or not self._pull(left):
                raise ProviderError("the file watcher did not start in the sandbox")

    def _pull(self, timeout: float | None) -> bool:
        """Read what arrives within `timeout`; False at the end of the stream."""
        ready, _, _ = select.select([self._sock], [], [], timeout)
        if not ready:
            return True
        try:
            data = self._sock.recv(65536)
        except OSError:
            data = b""
        if not data:
            self._closed = True
            return False
        self._frames += data
        while len(self._frames) >= 5:
            size = int.from_bytes(self._frames[1:5], "big")
            if size > MAX_FRAME:
                self._closed = True
                return False
            if len(self._frames) < 5 + size:
                break
            kind = bytes(self._frames[:1])
            payload = bytes(self._frames[5 : 5 + size])
            del self._frames[: 5 + size]
            if kind == b"O":
                self._records += payload
            elif kind == b"X":
                self._closed = True
                return False
        return True

    def _take(self) -> list[tuple[str, str]]:
        *records, self._records = self._records.split(b"\0")
        out = []
        for record in records:
            self._consumed += len(record) + 1
            kinds, _, full = record.decode("utf-8", "surrogateescape").partition(" ")
            if kinds:
                out.append((kinds, full))
        return out

    def __next__(self) -> list[FileEvent]:
        while True:
            batch = self._take()
            deadline = time.monotonic() + self._batch_s if batch else None
            while not self._closed:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._pull(left)
                more = self._take()
                if more and deadline is None:
                    deadline = time.monotonic() + self._batch_s
                batch += more
            self.offset = self._consumed
            events = file_events(batch)
            if events:
                return events
            if self._closed:
                raise StopIteration

    def drain(self, wait_s: float) -> list[FileEvent]:
        """The events the watch holds now, and those that arrive until it has been quiet
        for `wait_s` (a poll, not a wait for the next change); `offset` moves past them."""
        while not self._closed:
            held = len(self._frames) + len(self._records)
            self._pull(wait_s)
            if len(self._frames) + len(self._records) == held:
                break
        events = file_events(self._take())
        self.offset = self._consumed
        return events

    def detach(self) -> None:
        """Hang up and leave the watch recording (for its orphan time). Idempotent."""
        self._closed = True
        self._sock.close()

    def close(self) -> None:
        """End the watch in the sandbox. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._sock.sendall(frame(b"Q"))
        except OSError:
            pass
        self._sock.close()
