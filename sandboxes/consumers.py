"""WebSocket consumers: terminals, the sandbox events socket and streaming execution.

Every consumer authenticates the same way (sandboxes.realtime.realtime_authorize), refuses
with a close code after accepting (4401 auth, 4402 billing, 4403 scope, 4404 tenancy) and
sends through one outbound queue drained by a pump task, so PTY callbacks never await.
Messages are documented in the README (Real-time section).
"""

from __future__ import annotations

import asyncio
import base64
import codecs
import json
import logging
import secrets
import time
import uuid
from collections import deque
from typing import Any

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from playground.errors import ApplicationError, PaymentRequired

from . import services
from .models import SandboxState
from .providers.base import Capability, ProviderError, PtySession
from .realtime import (
    RealtimeDenied,
    realtime_authorize,
    realtime_record,
    sandbox_events_group,
)
from .terminals import Terminal, clamp_size, terminal_manager
from .watchers import (
    MAX_DEBOUNCE_MS,
    MAX_WATCHERS_PER_SOCKET,
    FileWatcher,
    WatchSpec,
    sandbox_pollers,
)

logger = logging.getLogger(__name__)

NO_CHANNEL_LAYER = "__sandpit_none__"
"""Alias of no configured layer: terminal and exec sockets need no layer channel (and no
Redis connection each)."""
METER_FLUSH_S = 1.0
METER_WINDOW_S = 60.0
"""Terminal input is counted at least once per started window (of a socket) with any input:
keystrokes that run commands without an Enter (Ctrl-O, a `read -d ';'` loop, a program in
raw mode) cannot make a terminal free."""
meter_clock = time.monotonic
"""The clock of those windows (a module attribute, so tests can drive it)."""
MAX_SLOW_CLIENT_BYTES = 8 * 1024 * 1024
"""A socket that falls this far behind the terminal is closed (1013) rather than buffered."""
_CLOSE = object()


class _OutboundConsumer(AsyncWebsocketConsumer):
    """Sends go through a deque drained by one task: callbacks on the loop (PTY readers,
    watchers) enqueue without awaiting and frames keep their order."""

    def _init_outbound(self) -> None:
        self._out: deque[Any] = deque()
        self._out_bytes = 0
        self._out_wakeup: asyncio.Future[None] | None = None
        self._busy = False
        """A send is suspended mid-way (the pump's or a resumed direct one): queue behind it."""
        self._tasks: set[asyncio.Task[Any]] = set()
        self._pump_task: asyncio.Task[None] | None = asyncio.ensure_future(self._pump())

    def enqueue(self, item: Any) -> None:
        """bytes → binary frame, dict → JSON text frame, (_CLOSE, code) → close after the rest.

        With nothing queued the frame is sent right here, driving the server's send
        coroutine by hand: daphne's never suspends, so output leaves in the same loop
        iteration that read it (one wake-up fewer per keystroke than going via the pump).
        """
        if not hasattr(self, "_out"):
            return
        if not self._out and not self._busy and not isinstance(item, tuple):
            self._send_now(item)
            return
        if isinstance(item, bytes):
            if self._out and isinstance(self._out[-1], bytes):
                self._out[-1] += item
            else:
                self._out.append(item)
            self._out_bytes += len(item)
            if self._out_bytes > MAX_SLOW_CLIENT_BYTES:
                self._out.clear()
                self._out.append({"type": "error", "code": "slow_client", "message": "Too slow."})
                self._out.append((_CLOSE, 1013))
        else:
            self._out.append(item)
        self._wake()

    def _wake(self) -> None:
        waiter = self._out_wakeup
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    @staticmethod
    def _frame(item: Any) -> dict[str, Any]:
        if isinstance(item, bytes):
            return {"type": "websocket.send", "bytes": item}
        return {"type": "websocket.send", "text": json.dumps(item)}

    def _send_now(self, item: Any) -> None:
        coro = self.base_send(self._frame(item))
        try:
            yielded = coro.send(None)
        except StopIteration:
            return
        except Exception:  # noqa: BLE001 - a send to a closing socket; disconnect follows
            logger.debug("direct send failed", exc_info=True)
            return
        # It suspended: finish it (as a Task would) before anything else is sent.
        self._busy = True
        self.spawn(self._resume(coro, yielded))

    async def _resume(self, coro: Any, yielded: Any) -> None:
        try:
            while True:
                if isinstance(yielded, asyncio.Future):
                    yielded._asyncio_future_blocking = False
                    await asyncio.wait([yielded])
                else:
                    await asyncio.sleep(0)
                try:
                    yielded = coro.send(None)
                except StopIteration:
                    return
        finally:
            self._busy = False
            self._wake()

    async def _pump(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._out or self._busy:
                self._out_wakeup = loop.create_future()
                await self._out_wakeup
                self._out_wakeup = None
                continue
            item = self._out.popleft()
            self._busy = True
            try:
                if isinstance(item, bytes):
                    self._out_bytes -= len(item)
                    await self.base_send(self._frame(item))
                elif isinstance(item, tuple) and item and item[0] is _CLOSE:
                    await self.close(code=item[1])
                    return
                else:
                    await self.base_send(self._frame(item))
            finally:
                self._busy = False

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _stop_outbound(self) -> None:
        for task in [getattr(self, "_pump_task", None), *getattr(self, "_tasks", ())]:
            if task is not None:
                task.cancel()

    async def refuse(self, denied: RealtimeDenied) -> None:
        await self.accept()
        await self.send(
            text_data=json.dumps({"type": "error", "code": denied.code, "message": denied.message})
        )
        await self.close(code=denied.close_code)

    def error(self, code: str, message: str, **extra: Any) -> None:
        self.enqueue({"type": "error", "code": code, "message": message, **extra})

    def parse_json(self, text: str) -> dict[str, Any] | None:
        try:
            message = json.loads(text)
        except ValueError:
            message = None
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            self.error("invalid_message", "Send a JSON object with a 'type'.")
            return None
        return message


def count_enters(data: bytes) -> int:
    """Each Enter counts one execution; a pasted CRLF is one Enter, not two."""
    return data.count(b"\r") + data.count(b"\n") - data.count(b"\r\n")


class TerminalMeter:
    """The terminal counting rule: in each started window of METER_WINDOW_S in which input
    arrived, max(1, Enters in that window) executions."""

    def __init__(self) -> None:
        self._started = meter_clock()
        self._window = -1
        self._enters = 0
        self._charged = 0

    def input(self, data: bytes) -> int:
        """Executions newly due for this input (0 or more)."""
        window = int((meter_clock() - self._started) // METER_WINDOW_S)
        if window != self._window:
            self._window, self._enters, self._charged = window, 0, 0
        self._enters += count_enters(data)
        due = max(1, self._enters) - self._charged
        self._charged += due
        return due


class TerminalConsumer(_OutboundConsumer):
    """/ws/sandboxes/<id>/terminals/<tid>: raw bytes both ways, JSON for control."""

    channel_layer_alias = NO_CHANNEL_LAYER

    async def connect(self) -> None:
        kwargs = self.scope["url_route"]["kwargs"]
        sandbox_id, terminal_id = kwargs["sandbox_id"], kwargs["terminal_id"]
        try:
            self.principal, self.sandbox = await database_sync_to_async(realtime_authorize)(
                self.scope, sandbox_id=sandbox_id, required_scope="terminal", feature="terminal"
            )
        except RealtimeDenied as denied:
            await self.refuse(denied)
            return
        terminal = terminal_manager.get(sandbox_id, terminal_id)
        if terminal is None:
            await self.refuse(
                RealtimeDenied(
                    4404,
                    404,
                    "terminal_not_found",
                    "No such terminal (terminals live in the web process that created them).",
                )
            )
            return
        self.terminal: Terminal | None = terminal
        self._lines = 0
        self._line_seq = 0
        self._meter = TerminalMeter()
        self._meter_id = uuid.uuid4().hex
        await self.accept()
        self._init_outbound()
        replay = terminal.attach(self)
        if replay:
            self.enqueue(replay)
        if terminal.ended:
            self.terminal_exited(terminal.exit_code)
            return
        self.spawn(self._meter_loop())

    # TerminalClient ---------------------------------------------------------------------------

    def terminal_output(self, data: bytes) -> None:
        self.enqueue(data)

    def terminal_exited(self, code: int | None) -> None:
        self.enqueue({"type": "exit", "code": code})
        self.enqueue((_CLOSE, 1000))

    # input --------------------------------------------------------------------------------------

    async def dispatch(self, message: dict[str, Any]) -> None:
        # Channels closes stale DB connections (a thread-pool round trip) before every
        # message; keystrokes never touch the database (metering goes through
        # database_sync_to_async, which does that itself), so they skip it.
        if message["type"] == "websocket.receive":
            await self.websocket_receive(message)
            return
        await super().dispatch(message)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        terminal = getattr(self, "terminal", None)
        if terminal is None:
            return
        if bytes_data is not None:
            self._input(terminal, bytes_data)
            return
        message = self.parse_json(text_data or "")
        if message is None:
            return
        kind = message["type"]
        if kind == "input" and isinstance(message.get("data"), str):
            self._input(terminal, message["data"].encode("utf-8", "surrogatepass"))
        elif kind == "resize":
            try:
                cols, rows = clamp_size(int(message["cols"]), int(message["rows"]))
            except (KeyError, TypeError, ValueError):
                self.error("invalid_message", "resize needs integer 'cols' and 'rows'.")
                return
            try:
                await terminal.resize(cols, rows)
            except ProviderError as exc:
                self.error(exc.code, exc.message)
        elif kind == "ping":
            self.enqueue({"type": "pong"})
        else:
            self.error("invalid_message", f"Unknown message type '{kind}'.")

    def _input(self, terminal: Terminal, data: bytes) -> None:
        terminal.write(data)
        self._lines += self._meter.input(data)

    # metering -----------------------------------------------------------------------------------

    async def _meter_loop(self) -> None:
        while True:
            await asyncio.sleep(METER_FLUSH_S)
            if self._lines:
                try:
                    await self._flush_lines()
                except PaymentRequired as exc:
                    self.error(exc.code, exc.message)
                    self.enqueue((_CLOSE, 4402))
                    return

    async def _flush_lines(self, authorize: bool = True) -> None:
        count, self._lines = self._lines, 0
        first = self._line_seq
        self._line_seq += count
        principal = self.principal

        def record() -> None:
            from billing.metering import metering_authorize

            for seq in range(first, first + count):
                realtime_record(principal, "terminal.line", f"term:{self._meter_id}:{seq}")
            if authorize:
                metering_authorize(organization=principal.organization, feature="terminal")

        await database_sync_to_async(record)()

    async def disconnect(self, code: int) -> None:
        terminal = getattr(self, "terminal", None)
        if terminal is not None:
            terminal.detach(self)
        self._stop_outbound()
        if getattr(self, "_lines", 0):
            try:
                await self._flush_lines(authorize=False)
            except Exception:  # noqa: BLE001 - never lose the disconnect over billing
                logger.warning("could not record terminal lines", exc_info=True)


class SandboxEventsConsumer(_OutboundConsumer):
    """/ws/sandboxes/<id>/events: status, ports, process exits and file watchers."""

    async def connect(self) -> None:
        sandbox_id = self.scope["url_route"]["kwargs"]["sandbox_id"]
        try:
            self.principal, self.sandbox = await database_sync_to_async(realtime_authorize)(
                self.scope, sandbox_id=sandbox_id, required_scope=None, feature=None
            )
        except RealtimeDenied as denied:
            await self.refuse(denied)
            return
        self.watchers: dict[str, FileWatcher] = {}
        self._watcher_seq = 0
        self._group = sandbox_events_group(self.sandbox.id)
        if self.channel_layer is not None:
            await self.channel_layer.group_add(self._group, self.channel_name)
        await self.accept()
        self._init_outbound()
        signals = ["status"]
        wants_ports = await self._ports_allowed()
        if self.sandbox.state == SandboxState.RUNNING and self.sandbox.provider_id:
            try:
                provider = services.provider_for(self.sandbox)
            except ProviderError:
                provider = None
            if provider is not None:
                sandbox_pollers.subscribe(
                    sandbox_id=self.sandbox.id,
                    provider=provider,
                    provider_id=self.sandbox.provider_id,
                    deliver=self.enqueue,
                    ports=wants_ports,
                )
                self._subscribed = True
                if wants_ports:
                    signals.append("ports")
                signals.append("processes")
        if self.principal.has_scope("files"):
            signals.append("files")
        self.enqueue(
            {
                "type": "ready",
                "sandbox": self.sandbox.id,
                "state": self.sandbox.state,
                "signals": signals,
            }
        )

    async def _ports_allowed(self) -> bool:
        if not self.principal.has_scope("ports"):
            return False
        from billing.metering import metering_authorize

        try:
            await database_sync_to_async(metering_authorize)(
                organization=self.principal.organization, feature="ports"
            )
        except PaymentRequired:
            return False
        return True

    async def sandbox_event(self, message: dict[str, Any]) -> None:
        """From the channel layer (sandbox_event_broadcast): forward as is."""
        self.enqueue(message["event"])

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if not hasattr(self, "watchers"):
            return
        message = self.parse_json(text_data or "")
        if message is None:
            return
        kind = message["type"]
        if kind == "watch":
            await self._watch(message)
        elif kind == "unwatch":
            watcher = self.watchers.pop(str(message.get("id")), None)
            if watcher is None:
                self.error("watcher_not_found", "No such watcher.", id=message.get("id"))
            else:
                watcher.close()
                self.enqueue({"type": "unwatched", "id": watcher.id})
        elif kind == "ping":
            self.enqueue({"type": "pong"})
        else:
            self.error("invalid_message", f"Unknown message type '{kind}'.")

    async def _watch(self, message: dict[str, Any]) -> None:
        request_id = message.get("request_id")
        if not self.principal.has_scope("files"):
            self.error("scope_missing", "This token lacks the 'files' scope.", status=403)
            return
        if len(self.watchers) >= MAX_WATCHERS_PER_SOCKET:
            self.error("watcher_limit_reached", "Too many watchers on this socket.", status=429)
            return
        try:
            spec = WatchSpec(
                path=str(message.get("path") or "."),
                recursive=bool(message.get("recursive", True)),
                ignore=tuple(str(p) for p in message.get("ignore") or ())[:64],
                debounce_ms=max(0, min(int(message.get("debounce_ms", 100)), MAX_DEBOUNCE_MS)),
            )
        except (TypeError, ValueError):
            self.error("invalid_message", "watch: path, recursive, ignore[], debounce_ms.")
            return
        principal = self.principal
        sandbox = self.sandbox

        def authorize() -> None:
            from billing.metering import metering_authorize

            metering_authorize(organization=principal.organization, feature="watch")

        try:
            await database_sync_to_async(authorize)()
            if sandbox.state != SandboxState.RUNNING:
                raise ApplicationError("The sandbox is not running.", code="sandbox_not_running")
            provider = services.provider_for(sandbox)
            services.require_capability(provider, Capability.WATCH)
            self._watcher_seq += 1
            watcher = FileWatcher(
                watcher_id=str(message.get("id") or f"w{self._watcher_seq}"),
                provider=provider,
                provider_id=sandbox.provider_id,
                spec=spec,
                deliver=self.enqueue,
            )
            await watcher.start()
        except (ApplicationError, ProviderError) as exc:
            status = getattr(exc, "status_code", None) or getattr(exc, "http_status", 400)
            self.error(exc.code, exc.message, status=status, request_id=request_id)
            return
        old = self.watchers.pop(watcher.id, None)
        if old is not None:
            old.close()
        self.watchers[watcher.id] = watcher
        await database_sync_to_async(realtime_record)(principal, "watch.create")
        self.enqueue(
            {
                "type": "watching",
                "id": watcher.id,
                "path": spec.path,
                "recursive": spec.recursive,
                "request_id": request_id,
            }
        )

    async def disconnect(self, code: int) -> None:
        for watcher in getattr(self, "watchers", {}).values():
            watcher.close()
        if getattr(self, "_subscribed", False):
            sandbox_pollers.unsubscribe(self.sandbox.id, self.enqueue)
        if self.channel_layer is not None and hasattr(self, "_group"):
            await self.channel_layer.group_discard(self._group, self.channel_name)
        self._stop_outbound()


# --- streaming execution ----------------------------------------------------------------------------

# Runs inside the sandbox on a PTY (the one live stream every provider offers), with the PTY
# in raw mode. It starts the command on pipes so stdout and stderr stay apart, and frames
# everything as "<kind> <base64>\n" lines: O stdout, E stderr, S started (pid), X exit code.
# Input frames: I <base64> stdin, C close stdin, K <signal> signal the process group.
EXEC_RUNNER = r"""
import base64,json,os,select,signal,subprocess,sys,time,tty
spec=json.loads(os.environ.pop("SANDPIT_EXEC"));os.environ.pop("SANDPIT_RUNNER",None)
try:tty.setraw(0)
except Exception:pass
def emit(k,d=b""):
    v=memoryview(k+b" "+base64.b64encode(d)+b"\n")
    while v:v=v[os.write(1,v):]
os.write(1,b"\x1e\x1eSANDPIT-READY\n")
env=dict(os.environ);env.update(spec.get("env") or {})
try:p=subprocess.Popen(spec["argv"],stdin=subprocess.PIPE,stdout=subprocess.PIPE,stderr=subprocess.PIPE,cwd=spec.get("cwd") or None,env=env,start_new_session=True)
except OSError as e:
    emit(b"E",(str(e)+"\n").encode());emit(b"X",b"127");sys.exit(0)
emit(b"S",str(p.pid).encode())
def kill(s=9):
    try:os.killpg(p.pid,s)
    except OSError:pass
outs={p.stdout.fileno():b"O",p.stderr.fileno():b"E"};buf=b"";fin=True;tmo=spec.get("timeout_s")
end=time.monotonic()+tmo if tmo else None;timed=False
while outs:
    w=None if end is None else max(0,end-time.monotonic())
    r,_,_=select.select(list(outs)+([0] if fin else []),[],[],w)
    if not r and end is not None and time.monotonic()>=end:kill();timed=True;end=None
    for fd in r:
        if fd==0:
            d=os.read(0,65536)
            if not d:kill();fin=False;continue
            buf+=d
            while b"\n" in buf:
                ln,buf=buf.split(b"\n",1);k,_,a=ln.partition(b" ")
                if k==b"I" and p.stdin:
                    try:p.stdin.write(base64.b64decode(a));p.stdin.flush()
                    except (BrokenPipeError,ValueError):pass
                elif k==b"C" and p.stdin:
                    try:p.stdin.close()
                    except OSError:pass
                elif k==b"K":kill(int(a or 9))
        else:
            d=os.read(fd,65536)
            if d:emit(outs[fd],d)
            else:del outs[fd]
c=p.wait();emit(b"T" if timed else b"X",str(c).encode())
"""
READY_MARK = b"\x1e\x1eSANDPIT-READY\n"
LANGUAGE_ARGV = {
    "python": ["python3", "-u", "-c"],
    "node": ["node", "-e"],
    "bash": ["bash", "-c"],
}
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


class ExecConsumer(_OutboundConsumer):
    """/ws/sandboxes/<id>/exec: run commands or code, stream stdout/stderr, stdin, cancel."""

    channel_layer_alias = NO_CHANNEL_LAYER

    async def connect(self) -> None:
        sandbox_id = self.scope["url_route"]["kwargs"]["sandbox_id"]
        try:
            self.principal, self.sandbox = await database_sync_to_async(realtime_authorize)(
                self.scope, sandbox_id=sandbox_id, required_scope="exec", feature="exec"
            )
        except RealtimeDenied as denied:
            await self.refuse(denied)
            return
        self.runs: dict[str, ExecRun] = {}
        await self.accept()
        self._init_outbound()

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
                # Input to a running program can be a whole new command (a shell reading
                # its stdin), so each stdin message with data is metered like a run.
                try:
                    await database_sync_to_async(self._meter_stdin)()
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
                number = services.parse_signal(message.get("signal", "SIGINT"))
            except ApplicationError as exc:
                self.error(exc.code, exc.message, id=run.id)
                return
            run.send(b"K " + str(number).encode() + b"\n")
        elif kind == "cancel":
            run.cancel()
        else:
            self.error("invalid_message", f"Unknown message type '{kind}'.")

    def _meter_stdin(self) -> None:
        """Authorize, then count, one stdin message (synchronous: call from a thread)."""
        from billing.metering import metering_authorize

        metering_authorize(organization=self.principal.organization, feature="exec")
        realtime_record(self.principal, "exec.stdin")

    async def _start(self, message: dict[str, Any]) -> None:
        run_id = str(message.get("id") or f"r{secrets.token_hex(4)}")
        if run_id in self.runs:
            self.error("run_exists", "A run with this id is still running.", id=run_id)
            return
        if len(self.runs) >= MAX_RUNS_PER_SOCKET:
            self.error("run_limit_reached", "Too many concurrent runs.", id=run_id, status=429)
            return
        try:
            argv, operation = self._argv(message)
            env = {str(k): str(v) for k, v in (message.get("env") or {}).items()}
            timeout_s = message.get("timeout_s")
            spec = {
                "argv": argv,
                "cwd": message.get("cwd"),
                "env": env,
                "timeout_s": float(timeout_s) if timeout_s else None,
            }
        except (ApplicationError, TypeError, ValueError, AttributeError) as exc:
            code = getattr(exc, "code", "invalid_message")
            self.error(code, getattr(exc, "message", str(exc)), id=run_id)
            return
        sandbox, principal = self.sandbox, self.principal

        def authorize_and_open() -> PtySession:
            from billing.metering import metering_authorize

            metering_authorize(organization=principal.organization, feature="exec")
            if sandbox.state != SandboxState.RUNNING:
                raise ApplicationError("The sandbox is not running.", code="sandbox_not_running")
            provider = services.provider_for(sandbox)
            services.require_capability(provider, Capability.PTY)
            return provider.open_pty(  # noqa: S604 - a fixed shell, not user input
                sandbox.provider_id,
                cols=200,
                rows=50,
                shell="/bin/sh",
                env={"SANDPIT_RUNNER": EXEC_RUNNER, "SANDPIT_EXEC": json.dumps(spec)},
            )

        try:
            pty = await database_sync_to_async(authorize_and_open)()
        except (ApplicationError, ProviderError) as exc:
            status = getattr(exc, "status_code", None) or getattr(exc, "http_status", 400)
            self.error(exc.code, exc.message, id=run_id, status=status)
            return
        pty.write(b'exec python3 -I -S -c "$SANDPIT_RUNNER"\n')
        run = ExecRun(self, run_id, pty)
        self.runs[run_id] = run
        self.spawn(database_sync_to_async(realtime_record)(principal, operation))
        self.spawn(database_sync_to_async(services.sandbox_touch_id)(sandbox.id))

    @staticmethod
    def _argv(message: dict[str, Any]) -> tuple[list[str], str]:
        if message.get("code") is not None:
            code = str(message["code"])
            language = services.resolve_language(code, message.get("language"))
            return [*LANGUAGE_ARGV[language], code], "exec.code"
        command = message.get("command")
        if not isinstance(command, str) or not command:
            raise ApplicationError("run needs 'command' or 'code'.", code="invalid_message")
        args = message.get("args")
        if args is None:
            return ["sh", "-c", command], "exec.command"
        return [command, *[str(a) for a in args]], "exec.command"

    async def disconnect(self, code: int) -> None:
        for run in list(getattr(self, "runs", {}).values()):
            run.cancel()
        await asyncio.sleep(0)
        closers = [t for t in getattr(self, "_tasks", ()) if not t.done()]
        if closers:
            await asyncio.wait(closers, timeout=5)
        self._stop_outbound()
