"""/ws/sandboxes/<id>/exec: run commands or code, stream stdout/stderr, stdin, signals, cancel.

Each run is sandboxes/programs/exec_runner.py on a PTY in the sandboxes (started by
sandboxes.streaming.sandbox_exec_stream_open); ExecRun turns its frames into JSON messages.
"""

from __future__ import annotations

import asyncio
import base64
import codecs
import secrets
import time
from typing import Any

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async

from playground.errors import ApplicationError, PaymentRequired
from sandboxes.services import parse_signal
from sandboxes.streaming import (
    READY_MARK,
    ProviderError,
    PtySession,
    exec_stream_argv,
    sandbox_exec_stream_open,
    sandbox_exec_stream_stdin,
)

from .auth import RealtimeDenied, realtime_authorize
from .outbound import NO_CHANNEL_LAYER, OutboundConsumer

MAX_RUNS_PER_SOCKET = 8


class ExecRun:
    """One streamed command: the runner on a PTY, its frames turned into JSON messages."""

    def __init__(self, consumer: ExecConsumer, run_id: str, pty: PtySession) -> None:
        self.consumer = consumer
        self.id = run_id
        self.pty = pty
        self.started = time.monotonic()
        self._buffer = b""
        self._ready = False
        self._early: list[bytes] = []
        self._decoders = {
            b"O": codecs.getincrementaldecoder("utf-8")("replace"),
            b"E": codecs.getincrementaldecoder("utf-8")("replace"),
        }
        self.finished = False
        self._loop = asyncio.get_running_loop()
        self._fd = pty.fileno()
        self._loop.add_reader(self._fd, self._on_readable)

    def _on_readable(self) -> None:
        try:
            data = self.pty.read(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._finish(None, reason="ended")
            return
        self._buffer += data
        if not self._ready:
            mark = self._buffer.find(READY_MARK)
            if mark < 0:
                self._buffer = self._buffer[-len(READY_MARK) :]
                return
            self._buffer = self._buffer[mark + len(READY_MARK) :]
            self._ready = True
            for frame in self._early:
                self.pty.write(frame)
            self._early.clear()
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            kind, _, payload = line.strip(b"\r").partition(b" ")
            try:
                value = base64.b64decode(payload)
            except ValueError:
                continue
            if kind in self._decoders:
                text = self._decoders[kind].decode(value)
                if text:
                    stream = "stdout" if kind == b"O" else "stderr"
                    self.consumer.enqueue({"type": stream, "id": self.id, "data": text})
            elif kind == b"S":
                self.consumer.enqueue({"type": "started", "id": self.id, "pid": int(value or 0)})
            elif kind in (b"X", b"T"):
                self._finish(int(value or -1), reason="timeout" if kind == b"T" else None)
                return

    def send(self, frame: bytes) -> None:
        if self.finished:
            return
        if not self._ready:
            self._early.append(frame)
        else:
            self.pty.write(frame)

    def _finish(self, code: int | None, *, reason: str | None) -> None:
        if self.finished:
            return
        self.finished = True
        try:
            self._loop.remove_reader(self._fd)
        except (ValueError, OSError):
            pass
        for kind, decoder in self._decoders.items():
            rest = decoder.decode(b"", final=True)
            if rest:
                stream = "stdout" if kind == b"O" else "stderr"
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
        self.consumer.spawn(sync_to_async(self.pty.close, thread_sensitive=False)())

    def cancel(self) -> None:
        """Kill the process tree (closing the PTY session kills everything in it)."""
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
                run.send(b"I " + base64.b64encode(data) + b"\n")
            if message.get("eof"):
                run.send(b"C \n")
        elif kind == "stdin_close":
            run.send(b"C \n")
        elif kind == "signal":
            try:
                number = parse_signal(message.get("signal", "SIGINT"))
            except ApplicationError as exc:
                self.error(exc.code, exc.message, id=run.id)
                return
            run.send(b"K " + str(number).encode() + b"\n")
        elif kind == "cancel":
            run.cancel()
        else:
            self.error("invalid_message", f"Unknown message type '{kind}'.")

    async def _start(self, message: dict[str, Any]) -> None:
        run_id = str(message.get("id") or f"r{secrets.token_hex(4)}")
        if run_id in self.runs:
            self.error("run_exists", "A run with this id is still running.", id=run_id)
            return
        if len(self.runs) >= MAX_RUNS_PER_SOCKET:
            self.error("run_limit_reached", "Too many concurrent runs.", id=run_id, status=429)
            return
        try:
            argv, operation = exec_stream_argv(
                command=message.get("command"),
                args=message.get("args"),
                code=message.get("code"),
                language=message.get("language"),
            )
            env = {str(k): str(v) for k, v in (message.get("env") or {}).items()}
            timeout_s = message.get("timeout_s")
            timeout = float(timeout_s) if timeout_s else None
        except (ApplicationError, TypeError, ValueError, AttributeError) as exc:
            code = getattr(exc, "code", "invalid_message")
            self.error(code, getattr(exc, "message", str(exc)), id=run_id)
            return
        try:
            pty = await database_sync_to_async(sandbox_exec_stream_open)(
                caller=self.caller,
                sandbox=self.sandbox,
                argv=argv,
                operation=operation,
                cwd=message.get("cwd"),
                env=env,
                timeout_s=timeout,
            )
        except (ApplicationError, ProviderError) as exc:
            status = getattr(exc, "status_code", None) or getattr(exc, "http_status", 400)
            self.error(exc.code, exc.message, id=run_id, status=status)
            return
        self.runs[run_id] = ExecRun(self, run_id, pty)

    async def disconnect(self, code: int) -> None:
        for run in list(getattr(self, "runs", {}).values()):
            run.cancel()
        await asyncio.sleep(0)
        closers = [t for t in getattr(self, "_tasks", ()) if not t.done()]
        if closers:
            await asyncio.wait(closers, timeout=5)
        self.stop_outbound()
