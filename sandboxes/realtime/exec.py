"""/ws/sandboxes/<id>/exec: run commands or code, stream stdout/stderr, stdin, signals, cancel.

Each run is an ExecStream (started by sandboxes.streaming.sandbox_exec_stream_open: the
provider's own exec_stream, or the runner on a PTY); ExecRun turns its events into JSON
messages.
"""

from __future__ import annotations

import asyncio
import codecs
import secrets
import time
from collections.abc import Coroutine
from typing import Any, Protocol

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async

from common.errors import ApplicationError, PaymentRequired
from sandboxes.process_services import parse_signal
from sandboxes.streaming import (
    ExecStream,
    ProviderError,
    exec_stream_argv,
    sandbox_exec_stream_attach,
    sandbox_exec_stream_open,
    sandbox_exec_stream_stdin,
)

from .auth import RealtimeDenied, realtime_authorize
from .outbound import NO_CHANNEL_LAYER, OutboundConsumer

MAX_RUNS_PER_SOCKET = 8


class RunOwner(Protocol):
    """Who hears a run (the exec socket, or the E2B-compatible process service); every
    method is called on the loop."""

    def enqueue(self, message: dict[str, Any]) -> None: ...

    def run_finished(self, run: ExecRun) -> None: ...

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> object: ...


class ExecRun:
    """One streamed command: its ExecStream's events turned into JSON messages ('started'
    at once, then 'stdout'/'stderr', last 'exit') handed to the owner."""

    def __init__(self, owner: RunOwner, run_id: str, stream: ExecStream) -> None:
        self.consumer = owner
        self.id = run_id
        self.stream = stream
        self.started = time.monotonic()
        self._decoders = {
            "stdout": codecs.getincrementaldecoder("utf-8")("replace"),
            "stderr": codecs.getincrementaldecoder("utf-8")("replace"),
        }
        self.finished = False
        self._loop = asyncio.get_running_loop()
        self._fd = stream.fileno()
        started: dict[str, Any] = {"type": "started", "id": run_id, "pid": stream.pid}
        session = getattr(stream, "session_id", None)
        if session is not None:  # held by the agent: reattach with it from any process
            started["session"] = session
            started["offset"] = getattr(stream, "offset", 0)
        owner.enqueue(started)
        self._loop.add_reader(self._fd, self._on_readable)
        # The stream may hold events already (a command that ended while it started):
        # its descriptor would not become readable for those.
        self._loop.call_soon(self._on_readable)

    def _on_readable(self) -> None:
        if self.finished:
            return
        try:
            events = self.stream.read_events()
        except BlockingIOError:
            return
        for event in events:
            if event.type == "exit":
                self._finish(event.exit_code, reason="timeout" if event.timed_out else None)
                return
            text = self._decoders[event.type].decode(event.data)
            if text:
                message = {"type": event.type, "id": self.id, "data": text}
                offset = getattr(self.stream, "offset", None)
                if offset is not None:  # output bytes so far: `since` for a reattach
                    message["offset"] = offset
                self.consumer.enqueue(message)

    def write_stdin(self, data: bytes) -> None:
        """Input for the command; ignored once it has finished. Raises ProviderError when
        it takes no input for a while."""
        if not self.finished:
            self.stream.write_stdin(data)

    def close_stdin(self) -> None:
        if not self.finished:
            self.stream.close_stdin()

    def signal(self, number: int) -> None:
        """Signal the command's process group."""
        if not self.finished:
            self.stream.signal(number)

    def _finish(self, code: int | None, *, reason: str | None) -> None:
        if self.finished:
            return
        self.finished = True
        try:
            self._loop.remove_reader(self._fd)
        except (ValueError, OSError):
            pass
        for stream, decoder in self._decoders.items():
            rest = decoder.decode(b"", final=True)
            if rest:
                self.consumer.enqueue({"type": stream, "id": self.id, "data": rest})
        message: dict[str, Any] = {
            "type": "exit",
            "id": self.id,
            "code": code,
            "duration_ms": round((time.monotonic() - self.started) * 1000, 1),
        }
        if reason in ("timeout", "cancelled"):
            message[reason if reason == "cancelled" else "timed_out"] = True
        self.consumer.enqueue(message)
        self.consumer.run_finished(self)
        self.consumer.spawn(sync_to_async(self.stream.close, thread_sensitive=False)())

    def cancel(self) -> None:
        """Kill the process tree (closing the stream kills everything it started)."""
        self._finish(-9, reason="cancelled")


class ExecConsumer(OutboundConsumer):
    """Several concurrent runs per socket, each named by the client's `id`."""

    channel_layer_alias = NO_CHANNEL_LAYER

    async def connect(self) -> None:
        sandbox_id = self.scope["url_route"]["kwargs"]["sandbox_id"]
        try:
            self.caller, self.sandbox = await database_sync_to_async(realtime_authorize)(
                self.scope, sandbox_id=sandbox_id, required_scope="exec", feature="exec"
            )
        except RealtimeDenied as denied:
            await self.refuse(denied)
            return
        self.runs: dict[str, ExecRun] = {}
        await self.accept()
        self.init_outbound()

    def run_finished(self, run: ExecRun) -> None:
        self.runs.pop(run.id, None)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if not hasattr(self, "runs"):
            return
        message = self.parse_json(text_data or "")
        if message is None:
            return
        kind = message["type"]
        if kind == "run":
            await self._start(message)
            return
        if kind == "attach":
            await self._attach(message)
            return
        if kind == "ping":
            self.enqueue({"type": "pong"})
            return
        run = self.runs.get(str(message.get("id")))
        if run is None:
            self.error("run_not_found", "No such running command.", id=message.get("id"))
        elif kind == "stdin":
            data = str(message.get("data", "")).encode("utf-8", "surrogatepass")
            if data:
                try:
                    await database_sync_to_async(sandbox_exec_stream_stdin)(caller=self.caller)
                except PaymentRequired as exc:
                    self.error(exc.code, exc.message, id=run.id, status=402)
                    return
                except Exception as exc:
                    self.refuse_if_database_unavailable(exc, id=run.id)
                    return
                if not self._to_run(run, run.write_stdin, data):
                    return
            if message.get("eof"):
                self._to_run(run, run.close_stdin)
        elif kind == "stdin_close":
            self._to_run(run, run.close_stdin)
        elif kind == "signal":
            try:
                number = parse_signal(message.get("signal", "SIGINT"))
            except ApplicationError as exc:
                self.error(exc.code, exc.message, id=run.id)
                return
            self._to_run(run, run.signal, number)
        elif kind == "cancel":
            run.cancel()
        else:
            self.error("invalid_message", f"Unknown message type '{kind}'.")

    def _to_run(self, run: ExecRun, action: Any, *args: Any) -> bool:
        """Hand stdin, its end or a signal to a run; a provider error becomes an error
        message (the run goes on: its exit message still comes)."""
        try:
            action(*args)
        except ProviderError as exc:
            self.error(exc.code, exc.message, id=run.id, status=exc.status_code)
            return False
        return True

    async def _start(self, message: dict[str, Any]) -> None:
        run_id = str(message.get("id") or f"r{secrets.token_hex(4)}")
        if run_id in self.runs:
            self.error("run_exists", "A run with this id is still running.", id=run_id)
            return
        if len(self.runs) >= MAX_RUNS_PER_SOCKET:
            self.error("run_limit_reached", "Too many concurrent runs.", id=run_id, status=429)
            return
        try:
            argv, operation = await database_sync_to_async(exec_stream_argv)(
                command=message.get("command"),
                args=message.get("args"),
                code=message.get("code"),
                language=message.get("language"),
                sandbox=self.sandbox,
            )
            env = {str(k): str(v) for k, v in (message.get("env") or {}).items()}
            timeout_s = message.get("timeout_s")
            timeout = float(timeout_s) if timeout_s else None
        except (ApplicationError, TypeError, ValueError, AttributeError) as exc:
            code = getattr(exc, "code", "invalid_message")
            # The status REST would answer (400 unknown_language, 409 sandbox_not_running...),
            # so clients raise the same error either way.
            status = getattr(exc, "status_code", 400)
            self.error(code, getattr(exc, "message", str(exc)), id=run_id, status=status)
            return
        try:
            stream = await database_sync_to_async(sandbox_exec_stream_open)(
                caller=self.caller,
                sandbox=self.sandbox,
                argv=argv,
                operation=operation,
                cwd=message.get("cwd"),
                env=env,
                timeout_s=timeout,
            )
        except (ApplicationError, ProviderError) as exc:
            self.error(exc.code, exc.message, id=run_id, status=exc.status_code)
            return
        except Exception as exc:
            self.refuse_if_database_unavailable(exc, id=run_id)
            return
        self.runs[run_id] = ExecRun(self, run_id, stream)

    async def _attach(self, message: dict[str, Any]) -> None:
        """{"type": "attach", "session": <a run's session id>, "id": ..., "since": bytes}:
        continue a run started through any web process (the one that started it may be
        gone): its output from `since`, then live, stdin and signals as for a run."""
        run_id = str(message.get("id") or f"r{secrets.token_hex(4)}")
        if run_id in self.runs:
            self.error("run_exists", "A run with this id is still running.", id=run_id)
            return
        if len(self.runs) >= MAX_RUNS_PER_SOCKET:
            self.error("run_limit_reached", "Too many concurrent runs.", id=run_id, status=429)
            return
        try:
            since = max(0, int(message.get("since") or 0))
        except (TypeError, ValueError):
            self.error("invalid_message", "attach: 'since' is a byte offset.", id=run_id)
            return
        try:
            stream = await database_sync_to_async(sandbox_exec_stream_attach)(
                caller=self.caller,
                sandbox=self.sandbox,
                session_id=str(message.get("session") or ""),
                since=since,
            )
        except (ApplicationError, ProviderError) as exc:
            self.error(exc.code, exc.message, id=run_id, status=exc.status_code)
            return
        except Exception as exc:
            self.refuse_if_database_unavailable(exc, id=run_id)
            return
        self.runs[run_id] = ExecRun(self, run_id, stream)

    async def disconnect(self, code: int) -> None:
        for run in list(getattr(self, "runs", {}).values()):
            run.cancel()
        await asyncio.sleep(0)
        closers = [t for t in getattr(self, "_tasks", ()) if not t.done()]
        if closers:
            await asyncio.wait(closers, timeout=5)
        self.stop_outbound()
