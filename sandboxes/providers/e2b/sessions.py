"""The live sessions of an e2b sandbox: a terminal (the SDK's PTY callbacks fed into a pipe
so it has a real `fileno()`), a port stream (TLS to the sandbox's public host, relayed over
a socket pair) and a file watch (`watch_dir` polled)."""

from __future__ import annotations

import contextlib
import os
import posixpath
import socket
import threading
from typing import TYPE_CHECKING, Any

from sandboxes.providers.base import FileEvent, ProviderError

if TYPE_CHECKING:
    from .provider import E2BProvider

_WATCH_POLL_S = 0.1
_EVENT_TYPES = {"create": "created", "write": "modified", "remove": "deleted", "rename": "moved"}


class E2BPtySession:
    """A terminal in an e2b sandbox; output reaches `fileno()` through a pipe fed by a thread."""

    def __init__(self, provider: E2BProvider, sandbox: Any, handle: Any) -> None:
        self._provider = provider
        self._sandbox = sandbox
        self._pid: int = handle.pid
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        self._exit: int | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._pump, args=(handle,), name=f"e2b-pty-{self._pid}", daemon=True
        )
        self._thread.start()

    def _feed(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._write_fd, view) :]

    def _pump(self, handle: Any) -> None:
        code = -1
        try:
            code = self._provider._wait(handle, on_pty=self._feed)[0]
        except (ProviderError, OSError):
            pass  # the terminal ended abnormally: readers see end of stream, exit code -1
        finally:
            self._exit = code
            with contextlib.suppress(OSError):
                os.close(self._write_fd)

    def fileno(self) -> int:
        return self._read_fd

    def read(self, max_bytes: int = 65536) -> bytes:
        return os.read(self._read_fd, max_bytes)

    def write(self, data: bytes) -> None:
        with self._provider._translate():
            self._sandbox.pty.send_stdin(self._pid, data)

    def resize(self, cols: int, rows: int) -> None:
        sdk = self._provider._sdk
        with self._provider._translate():
            self._sandbox.pty.resize(self._pid, sdk.PtySize(rows=rows, cols=cols))

    def exit_code(self) -> int | None:
        return self._exit

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._exit is None:
            with contextlib.suppress(ProviderError):
                with self._provider._translate():
                    self._sandbox.pty.kill(self._pid)
        self._thread.join(timeout=5)
        with contextlib.suppress(OSError):
            os.close(self._read_fd)


class E2BPortStream:
    """A byte stream to a sandbox port: plain TCP (debug) or TLS bridged onto a socketpair.

    TLS records cannot be read from the raw descriptor, so for TLS two threads copy
    between the TLS socket and one end of a socketpair; `fileno()` is the other end, so
    callers that select on it or dup it see plaintext.
    """

    def __init__(self, upstream: socket.socket, tls: bool, host_header: str | None = None) -> None:
        self.host_header = host_header
        """The Host an HTTP client must send: E2B's edge routes by it."""
        self._upstream = upstream
        self._closed = False
        if not tls:
            self._sock = upstream
            return
        self._sock, inner = socket.socketpair()
        for src, dst in ((upstream, inner), (inner, upstream)):
            threading.Thread(target=self._copy, args=(src, dst), daemon=True).start()

    @staticmethod
    def _copy(src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def fileno(self) -> int:
        return self._sock.fileno()

    def recv(self, max_bytes: int = 65536) -> bytes:
        try:
            return self._sock.recv(max_bytes)
        except (ConnectionResetError, BrokenPipeError):
            return b""

    def sendall(self, data: bytes) -> None:
        self._sock.sendall(data)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for sock in {id(s): s for s in (self._sock, self._upstream)}.values():
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


class E2BWatch:
    """Batches of file events from `files.watch_dir`, polled; `close()` stops the watcher."""

    def __init__(self, provider: E2BProvider, handle: Any, root: str) -> None:
        self._provider = provider
        self._handle = handle
        self._root = root
        self._closed = threading.Event()

    def __iter__(self) -> E2BWatch:
        return self

    def __next__(self) -> list[FileEvent]:
        while not self._closed.is_set():
            with self._provider._translate(files=True):
                events = self._handle.get_new_events()
            batch = [e for e in (self._event(raw) for raw in events) if e is not None]
            if batch:
                return batch
            self._closed.wait(_WATCH_POLL_S)
        raise StopIteration

    def _event(self, raw: Any) -> FileEvent | None:
        kind = _EVENT_TYPES.get(str(getattr(raw.type, "value", raw.type)))
        if kind is None:  # chmod: not a change the explorer shows
            return None
        path = self._provider._paths.relative(posixpath.join(self._root, raw.name))
        entry = getattr(raw, "entry", None)
        is_dir = entry is not None and str(getattr(entry.type, "value", "")) == "dir"
        return FileEvent(type=kind, path=path, is_dir=is_dir)

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        with contextlib.suppress(ProviderError):
            with self._provider._translate(files=True):
                self._handle.stop()
