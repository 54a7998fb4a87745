"""The WebSocket side of the sync client: streamed commands, terminals and file watchers.

Each object owns one socket and one reader thread that turns frames into callbacks; the
caller's thread only sends and waits.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from typing import Any

from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from ._common import (
    ExecState,
    OutputCallback,
    file_events,
    ws_close_error,
    ws_error,
    ws_open_error,
)
from .errors import RequestTimeoutError, SandpitConnectionError, SandpitError, error_from
from .models import CommandResult, FileEvent


def open_socket(
    ws_base: str, path: str, api_key: str, open_timeout_s: float = 30
) -> ClientConnection:
    try:
        return connect(
            ws_base + path,
            additional_headers={"Authorization": f"Bearer {api_key}"},
            open_timeout=open_timeout_s,
            max_size=None,
        )
    except (InvalidStatus, OSError, TimeoutError) as exc:
        raise ws_open_error(exc, path) from None


class CommandHandle:
    """A command running over the exec socket: output to callbacks, stdin, kill, wait."""

    def __init__(
        self,
        ws: ClientConnection,
        message: dict[str, Any],
        *,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
        close_stdin: bool,
    ) -> None:
        self._ws = ws
        self.id: str = message["id"]
        self._state = ExecState(self.id, on_stdout, on_stderr)
        self._started = threading.Event()
        self._done = threading.Event()
        ws.send(json.dumps(message))
        if close_stdin:
            ws.send(json.dumps({"type": "stdin_close", "id": self.id}))
        self._thread = threading.Thread(
            target=self._read, name=f"sandpit-exec-{self.id}", daemon=True
        )
        self._thread.start()

    def _read(self) -> None:
        try:
            for frame in self._ws:
                over = self._state.feed(frame)
                if self._state.pid is not None:
                    self._started.set()
                if over:
                    break
        except ConnectionClosed as exc:
            if self._state.result is None and self._state.error is None:
                self._state.error = ws_close_error(exc.rcvd.code if exc.rcvd else None, "")
        finally:
            self._started.set()
            self._done.set()
            self._ws.close()

    @property
    def pid(self) -> int | None:
        """The process id inside the sandbox, once it started."""
        self._started.wait(30)
        return self._state.pid

    def send_stdin(self, data: str, *, eof: bool = False) -> None:
        self._send({"type": "stdin", "id": self.id, "data": data, "eof": eof})

    def close_stdin(self) -> None:
        self._send({"type": "stdin_close", "id": self.id})

    def signal(self, signal: str = "SIGINT") -> None:
        self._send({"type": "signal", "id": self.id, "signal": signal})

    def kill(self) -> bool:
        """Kill the whole process tree. False when it had already ended."""
        if self._done.is_set():
            return False
        self._send({"type": "cancel", "id": self.id})
        return True

    def _send(self, message: dict[str, Any]) -> None:
        try:
            self._ws.send(json.dumps(message))
        except ConnectionClosed:
            pass

    def wait(self, timeout_s: float | None = None) -> CommandResult:
        """The result once the command ends; raises the server's error if it could not run."""
        if not self._done.wait(timeout_s):
            raise RequestTimeoutError("The command is still running.", code="timeout")
        if self._state.error is not None:
            raise self._state.error
        assert self._state.result is not None
        return self._state.result

    @property
    def finished(self) -> bool:
        return self._done.is_set()


class Terminal:
    """An interactive shell on a PTY: raw bytes out to `on_data`, `send()` in."""

    def __init__(
        self,
        ws: ClientConnection,
        *,
        terminal_id: str,
        on_data: Callable[[bytes], Any] | None,
        on_kill: Callable[[], Any],
    ) -> None:
        self.id = terminal_id
        self.on_data = on_data
        """Called with each chunk of output (bytes) from the reader thread; settable."""
        self._ws = ws
        self._on_kill = on_kill
        self._done = threading.Event()
        self._buffer = bytearray()
        self._lock = threading.Lock()
        self.exit_code: int | None = None
        self.error: SandpitError | None = None
        self._thread = threading.Thread(
            target=self._read, name=f"sandpit-term-{terminal_id}", daemon=True
        )
        self._thread.start()

    def _read(self) -> None:
        try:
            for frame in self._ws:
                if isinstance(frame, bytes):
                    callback = self.on_data
                    if callback is None:
                        with self._lock:
                            self._buffer += frame
                    else:
                        callback(frame)
                    continue
                message = json.loads(frame)
                if message.get("type") == "exit":
                    self.exit_code = message.get("code")
                elif message.get("type") == "error":
                    self.error = ws_error(message)
        except ConnectionClosed:
            pass
        finally:
            self._done.set()

    def output(self) -> bytes:
        """Output received while no `on_data` was set (taken, so each byte is returned once)."""
        with self._lock:
            data, self._buffer = bytes(self._buffer), bytearray()
        return data

    def send(self, data: bytes | str) -> None:
        """Keystrokes or pasted text, as the terminal should receive them (\\r for Enter)."""
        try:
            self._ws.send(data.encode() if isinstance(data, str) else data)
        except ConnectionClosed as exc:
            raise SandpitConnectionError("The terminal socket is closed.", code="closed") from exc

    def resize(self, cols: int, rows: int) -> None:
        try:
            self._ws.send(json.dumps({"type": "resize", "cols": cols, "rows": rows}))
        except ConnectionClosed:
            pass

    def wait(self, timeout_s: float | None = None) -> int | None:
        """The shell's exit code once it ends."""
        if not self._done.wait(timeout_s):
            raise RequestTimeoutError("The terminal is still running.", code="timeout")
        if self.error is not None and self.exit_code is None:
            raise self.error
        return self.exit_code

    @property
    def closed(self) -> bool:
        return self._done.is_set()

    def close(self, *, kill: bool = True) -> None:
        """Detach; with `kill` (the default) the shell and its processes end too."""
        self._ws.close()
        self._done.wait(5)
        if kill:
            self._on_kill()

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Watcher:
    """File changes under a path, delivered to `on_event` from a reader thread."""

    def __init__(
        self,
        ws: ClientConnection,
        *,
        path: str,
        recursive: bool,
        on_event: Callable[[FileEvent], Any],
        ignore: list[str] | None,
        debounce_ms: int,
        timeout_s: float = 30,
    ) -> None:
        self._ws = ws
        self.on_event = on_event
        self.id = "w1"
        ready = self._next("ready", timeout_s)
        if "files" not in (ready.get("signals") or []):
            ws.close()
            raise error_from("scope_missing", "This credential cannot watch files.", 403)
        message: dict[str, Any] = {
            "type": "watch",
            "id": self.id,
            "path": path,
            "recursive": recursive,
            "debounce_ms": debounce_ms,
        }
        if ignore:
            message["ignore"] = list(ignore)
        ws.send(json.dumps(message))
        self._next("watching", timeout_s)
        self._thread = threading.Thread(target=self._read, name="sandpit-watch", daemon=True)
        self._thread.start()

    def _next(self, kind: str, timeout_s: float) -> dict[str, Any]:
        while True:
            try:
                frame = self._ws.recv(timeout=timeout_s)
            except TimeoutError:
                self._ws.close()
                raise RequestTimeoutError(
                    f"No '{kind}' from the events socket.", code="timeout"
                ) from None
            except ConnectionClosed as exc:
                raise ws_close_error(exc.rcvd.code if exc.rcvd else None, "") from None
            message = json.loads(frame)
            if message.get("type") == "error":
                self._ws.close()
                raise ws_error(message)
            if message.get("type") == kind:
                return dict(message)

    def _read(self) -> None:
        try:
            for frame in self._ws:
                message = json.loads(frame)
                if message.get("type") == "files" and message.get("watcher") == self.id:
                    for event in file_events(message):
                        self.on_event(event)
        except ConnectionClosed:
            pass

    def stop(self) -> None:
        self._ws.close()
        self._thread.join(5)

    def __enter__(self) -> Watcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def exec_handle(
    ws_base: str,
    path: str,
    api_key: str,
    message: dict[str, Any],
    *,
    stdin: str | None,
    on_stdout: OutputCallback | None,
    on_stderr: OutputCallback | None,
    keep_stdin_open: bool,
) -> CommandHandle:
    ws = open_socket(ws_base, path, api_key)
    handle = CommandHandle(
        ws,
        message,
        on_stdout=on_stdout,
        on_stderr=on_stderr,
        close_stdin=stdin is None and not keep_stdin_open,
    )
    if stdin is not None:
        handle.send_stdin(stdin, eof=not keep_stdin_open)
    return handle


__all__ = ["CommandHandle", "Terminal", "Watcher", "exec_handle", "open_socket", "Mapping"]
