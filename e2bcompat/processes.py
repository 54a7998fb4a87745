"""envd's process service (process.Process) on Sandpit: commands and PTYs.

A command is a streamed run (sandboxes.streaming.sandbox_exec_stream_open: stdout and
stderr apart, then the exit status), read by the exec socket's own ExecRun; a PTY
is a Sandpit terminal (sandboxes.terminals). Both are registered here under the pid the SDK
knows them by, so commands.list/connect/kill/send_stdin and pty.* find them later. The
shells and commands live in the sandbox's agent, but this pid registry is per web process:
the SDK's connect by pid must reach the process that started it.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from collections.abc import AsyncIterator
from typing import Any, Literal, cast

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from e2b.envd.process import process_pb as pb
from e2b.envd.process.process_connect import Process
from protobuf import Oneof

from sandboxes.caller import Caller
from sandboxes.models import Sandbox
from sandboxes.realtime.exec import ExecRun
from sandboxes.services import sandbox_process_signal
from sandboxes.streaming import sandbox_exec_stream_open, sandbox_exec_stream_stdin
from sandboxes.terminals import (
    TerminalInfo,
    TerminalSession,
    terminal_attach,
    terminal_create,
    terminal_kill,
    terminal_resize,
)

from . import translate
from .rpc import call, envd_caller
from .services import e2b_run_signal_authorize

PTY_PID_BASE = 4_000_000
"""PTYs get pids from here up: above any pid a Linux sandbox hands out (pid_max is at most
2^22), so they never collide with a command's real pid."""
_pty_pids = itertools.count(PTY_PID_BASE)

Event = tuple[str, Any]
"""('stdout' | 'stderr' | 'pty', bytes) or ('end', (exit_code, status))."""
Output = (
    Oneof[Literal["stdout"], bytes] | Oneof[Literal["stderr"], bytes] | Oneof[Literal["pty"], bytes]
)


class E2BProcess:
    """One command or PTY the SDK started, and the streams listening to it."""

    def __init__(self, sandbox: Sandbox, config: pb.ProcessConfig, tag: str | None) -> None:
        self.sandbox_id = sandbox.id
        self.config = config
        self.tag = tag
        self.pid = 0
        self.run: ExecRun | None = None
        self.terminal: TerminalInfo | None = None
        self.session: TerminalSession | None = None
        self.started = asyncio.Event()
        self.end: tuple[int, str] | None = None
        self._listeners: set[asyncio.Queue[Event]] = set()
        self._tasks: set[asyncio.Task[Any]] = set()

    def listen(self) -> asyncio.Queue[Event]:
        queue: asyncio.Queue[Event] = asyncio.Queue()
        self._listeners.add(queue)
        if self.end is not None:
            queue.put_nowait(("end", self.end))
        return queue

    def unlisten(self, queue: asyncio.Queue[Event]) -> None:
        self._listeners.discard(queue)

    def publish(self, event: Event) -> None:
        for queue in tuple(self._listeners):
            queue.put_nowait(event)

    def finish(self, exit_code: int, status: str) -> None:
        if self.end is not None:
            return
        self.end = (exit_code, status)
        self.publish(("end", self.end))
        self.started.set()
        registry.pop(self.sandbox_id, self.pid, self)

    # ExecRun's consumer interface: enqueue, run_finished, spawn (all on the loop).
    def enqueue(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind in ("stdout", "stderr"):
            self.publish((kind, str(message["data"]).encode("utf-8", "surrogateescape")))
        elif kind == "started":
            self.pid = int(message["pid"])
            registry.add(self)
            self.started.set()
        elif kind == "exit":
            code = message.get("code")
            if message.get("timed_out"):
                self.finish(-1, "timeout")
            elif code is None or code < 0:
                self.finish(-1, "signal: killed")
            else:
                self.finish(int(code), f"exit status {code}")

    def run_finished(self, run: ExecRun) -> None:
        return None

    def spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # TerminalClient: a PTY's output and exit.
    def terminal_output(self, data: bytes) -> None:
        self.publish(("pty", data))

    def terminal_exited(self, code: int | None) -> None:
        self.finish(code if code is not None else -1, f"exit status {code}")


class Registry:
    """The live processes of this web process, by (sandbox id, pid)."""

    def __init__(self) -> None:
        self._processes: dict[tuple[str, int], E2BProcess] = {}

    def add(self, process: E2BProcess) -> None:
        self._processes[(process.sandbox_id, process.pid)] = process

    def pop(self, sandbox_id: str, pid: int, process: E2BProcess) -> None:
        if self._processes.get((sandbox_id, pid)) is process:
            del self._processes[(sandbox_id, pid)]

    def get(self, sandbox_id: str, selector: pb.ProcessSelector | None) -> E2BProcess:
        """The process a selector names (pid or tag); NOT_FOUND otherwise."""
        chosen = selector.selector if selector is not None else None
        for (sid, pid), process in self._processes.items():
            if sid != sandbox_id or chosen is None:
                continue
            if (chosen.field == "pid" and pid == chosen.value) or (
                chosen.field == "tag" and process.tag == chosen.value
            ):
                return process
        raise ConnectError(Code.NOT_FOUND, "process not found")

    def for_sandbox(self, sandbox_id: str) -> list[E2BProcess]:
        return [p for (sid, _), p in self._processes.items() if sid == sandbox_id]


registry = Registry()


def _event(event: pb.ProcessEvent, response: type[Any]) -> Any:
    return response(event=event)


def _start_event(pid: int) -> pb.ProcessEvent:
    start: Oneof[Literal["start"], pb.ProcessEvent.StartEvent]
    start = Oneof("start", pb.ProcessEvent.StartEvent(pid=pid))
    return pb.ProcessEvent(event=start)


def _to_event(item: Event) -> pb.ProcessEvent:
    kind, value = item
    if kind == "end":
        exit_code, status = value
        end: Oneof[Literal["end"], pb.ProcessEvent.EndEvent]
        end = Oneof(
            "end", pb.ProcessEvent.EndEvent(exit_code=exit_code, exited=True, status=status)
        )
        return pb.ProcessEvent(event=end)
    # Any other kind is an output stream's (see Event).
    output = cast(Output, Oneof(kind, value))
    data: Oneof[Literal["data"], pb.ProcessEvent.DataEvent]
    data = Oneof("data", pb.ProcessEvent.DataEvent(output=output))
    return pb.ProcessEvent(event=data)


async def _stream(
    process: E2BProcess, queue: asyncio.Queue[Event], response: type[Any]
) -> AsyncIterator[Any]:
    """Start event, then output until the end event; the process outlives the stream."""
    try:
        yield response(event=_start_event(process.pid))
        while True:
            item = await queue.get()
            yield response(event=_to_event(item))
            if item[0] == "end":
                return
    finally:
        process.unlisten(queue)


def _timeout_s(ctx: RequestContext[Any, Any]) -> float | None:
    remaining = ctx.timeout_ms
    return remaining / 1000 if remaining else None


class ProcessService(Process):
    """process.Process for the SDK's commands and pty modules."""

    async def _start_command(
        self, caller: Caller, sandbox: Sandbox, request: pb.StartRequest, ctx: Any
    ) -> E2BProcess:
        config = request.process or pb.ProcessConfig()
        stream = await call(
            sandbox_exec_stream_open,
            caller=caller,
            sandbox=sandbox,
            argv=[config.cmd, *config.args],
            operation="exec.command",
            cwd=translate.sandbox_cwd(config.cwd if config.has_field("cwd") else None),
            env=dict(config.envs),
            timeout_s=_timeout_s(ctx),
        )
        process = E2BProcess(sandbox, config, request.tag if request.has_field("tag") else None)
        process.run = ExecRun(process, "e2b" + secrets.token_hex(4), stream)
        if not (request.has_field("stdin") and request.stdin):
            process.run.close_stdin()  # E2B closes stdin unless asked to keep it
        return process

    async def _start_pty(
        self, caller: Caller, sandbox: Sandbox, request: pb.StartRequest
    ) -> E2BProcess:
        config = request.process or pb.ProcessConfig()
        size = (
            request.pty.size if request.pty and request.pty.size else pb.PTY.Size(cols=80, rows=24)
        )
        terminal = await call(
            terminal_create,
            caller=caller,
            sandbox=sandbox,
            cols=size.cols or 80,
            rows=size.rows or 24,
            cwd=translate.sandbox_cwd(config.cwd if config.has_field("cwd") else None),
            env=dict(config.envs),
        )
        process = E2BProcess(sandbox, config, request.tag if request.has_field("tag") else None)
        process.pid = next(_pty_pids)
        process.terminal = terminal
        process.session = session = await call(
            terminal_attach, caller=caller, sandbox=sandbox, terminal_id=terminal.id
        )
        if session is None:  # killed between the two calls
            raise ConnectError(Code.NOT_FOUND, "the terminal has ended")
        registry.add(process)
        process.started.set()
        scrollback = session.terminal.attach(process)
        if scrollback:
            process.publish(("pty", scrollback))
        return process

    async def start(
        self, request: pb.StartRequest, ctx: RequestContext[Any, Any]
    ) -> AsyncIterator[pb.StartResponse]:
        caller, sandbox = await envd_caller(ctx)
        if request.pty is not None:
            process = await self._start_pty(caller, sandbox, request)
        else:
            process = await self._start_command(caller, sandbox, request, ctx)
        queue = process.listen()
        await process.started.wait()
        async for response in _stream(process, queue, pb.StartResponse):
            yield response

    async def connect(
        self, request: pb.ConnectRequest, ctx: RequestContext[Any, Any]
    ) -> AsyncIterator[pb.ConnectResponse]:
        """Attach to a running process's output (not counted: runs nothing)."""
        _, sandbox = await envd_caller(ctx)
        process = registry.get(sandbox.id, request.process)
        async for response in _stream(process, process.listen(), pb.ConnectResponse):
            yield response

    async def list(self, request: pb.ListRequest, ctx: RequestContext[Any, Any]) -> pb.ListResponse:
        """The commands and PTYs the SDK started (not counted: read from this process)."""
        _, sandbox = await envd_caller(ctx)
        return pb.ListResponse(
            processes=[
                pb.ProcessInfo(config=p.config, pid=p.pid, tag=p.tag)
                for p in registry.for_sandbox(sandbox.id)
            ]
        )

    async def _send(
        self, caller: Caller, sandbox: Sandbox, process: E2BProcess, data: pb.ProcessInput
    ) -> None:
        chosen = data.input
        if chosen is None or not chosen.value:
            return
        payload: bytes = chosen.value
        if process.session is not None:
            # A PTY counts by the terminal rule (each Enter, at least one per window).
            process.session.write(payload)
            first, count = process.session.take()
            await call(process.session.flush, first=first, count=count)
        elif process.run is not None:
            await call(sandbox_exec_stream_stdin, caller=caller)
            process.run.write_stdin(payload)

    async def send_input(
        self, request: pb.SendInputRequest, ctx: RequestContext[Any, Any]
    ) -> pb.SendInputResponse:
        caller, sandbox = await envd_caller(ctx)
        process = registry.get(sandbox.id, request.process)
        await self._send(caller, sandbox, process, request.input or pb.ProcessInput())
        return pb.SendInputResponse()

    async def stream_input(
        self, request: AsyncIterator[pb.StreamInputRequest], ctx: RequestContext[Any, Any]
    ) -> pb.StreamInputResponse:
        caller, sandbox = await envd_caller(ctx)
        process: E2BProcess | None = None
        async for message in request:
            event = message.event
            if event is None:
                continue
            if event.field == "start":
                process = registry.get(sandbox.id, event.value.process)
            elif event.field == "data":
                if process is None:
                    raise ConnectError(Code.INVALID_ARGUMENT, "start the stream first")
                await self._send(caller, sandbox, process, event.value.input or pb.ProcessInput())
        return pb.StreamInputResponse()

    async def send_signal(
        self, request: pb.SendSignalRequest, ctx: RequestContext[Any, Any]
    ) -> pb.SendSignalResponse:
        caller, sandbox = await envd_caller(ctx)
        number = int(request.signal) or 15
        try:
            process = registry.get(sandbox.id, request.process)
        except ConnectError:
            chosen = request.process.selector if request.process else None
            if chosen is None or chosen.field != "pid":
                raise
            # Not one the SDK started here: signal the sandbox's process by pid.
            await call(
                sandbox_process_signal,
                caller=caller,
                sandbox=sandbox,
                pid=chosen.value,
                signal=number,
            )
            return pb.SendSignalResponse()
        if process.terminal is not None:
            await call(
                terminal_kill, caller=caller, sandbox=sandbox, terminal_id=process.terminal.id
            )
            process.finish(-1, "signal: killed")
        elif process.run is not None:
            await call(e2b_run_signal_authorize, caller=caller, number=number)
            process.run.signal(number)
        return pb.SendSignalResponse()

    async def close_stdin(
        self, request: pb.CloseStdinRequest, ctx: RequestContext[Any, Any]
    ) -> pb.CloseStdinResponse:
        """End of input (not counted, as on the exec socket)."""
        _, sandbox = await envd_caller(ctx)
        process = registry.get(sandbox.id, request.process)
        if process.run is not None:
            process.run.close_stdin()
        return pb.CloseStdinResponse()

    async def update(
        self, request: pb.UpdateRequest, ctx: RequestContext[Any, Any]
    ) -> pb.UpdateResponse:
        """Resize a PTY (counted once, 'terminal.resize')."""
        caller, sandbox = await envd_caller(ctx)
        process = registry.get(sandbox.id, request.process)
        if process.terminal is None:
            raise ConnectError(Code.INVALID_ARGUMENT, "only a PTY can be resized")
        size = request.pty.size if request.pty and request.pty.size else None
        if size is not None:
            await call(
                terminal_resize,
                caller=caller,
                sandbox=sandbox,
                terminal_id=process.terminal.id,
                cols=size.cols,
                rows=size.rows,
            )
        return pb.UpdateResponse()
