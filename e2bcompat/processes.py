"""envd's process service (process.Process) on Sandpit: commands and PTYs.

A command is a streamed run (sandboxes.streaming.sandbox_exec_stream_open: stdout and
stderr apart, then the exit status); a PTY is a Sandpit terminal (sandboxes.terminals).

Where they are found again. With a provider that runs the agent (local, docker) both
live in the sandbox's agent, started with `meta` {"e2b": ...} (command, arguments,
environment, cwd, tag), and the pid the SDK knows is the process's own pid in the
sandbox. Every RPC asks the agent (sandboxes.streaming.sandbox_sessions_list), so
commands.list/connect/kill/send_stdin and pty.* work through whichever web process they
reach, and outlive the one that started them; a start or connect stream relays its own
attachment and hangs up when the SDK does (the process goes on, as in E2B). Providers
without the agent (the cloud ones) keep them in this process (`local_processes`), as
their terminals (sandboxes/terminal_registry.py): the SDK has to reach the web process
that started them.
"""

from __future__ import annotations

import asyncio
import itertools
import json
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
from sandboxes.process_services import sandbox_process_signal
from sandboxes.streaming import (
    ExecStream,
    SessionInfo,
    sandbox_exec_stream_attach,
    sandbox_exec_stream_open,
    sandbox_exec_stream_stdin,
    sandbox_session_send,
    sandbox_sessions_list,
)
from sandboxes.terminals import (
    AgentTerminal,
    TerminalSession,
    terminal_attach,
    terminal_create,
    terminal_kill,
    terminal_resize,
)

from . import translate
from .rpc import call, envd_caller, within_deadline
from .services import e2b_pty_input, e2b_run_signal_authorize

PTY_PID_BASE = 4_000_000
"""A cloud provider's PTY has no pid we can see: those get pids from here up, above any
pid a Linux sandbox hands out (pid_max is at most 2^22), so they never collide with a
command's real pid."""
_cloud_pty_pids = itertools.count(PTY_PID_BASE)
COMMAND_END_GRACE_S = 2.0
META_KEY = "e2b"
MAX_META_BYTES = 3500
"""What the agent keeps with a session is small (4 KiB): a long environment or argument
list is left out of what commands.list shows (the process gets all of it)."""

Event = tuple[str, Any]
"""('stdout' | 'stderr' | 'pty', bytes) or ('end', (exit_code, status))."""
Output = (
    Oneof[Literal["stdout"], bytes] | Oneof[Literal["stderr"], bytes] | Oneof[Literal["pty"], bytes]
)


def _end_of(code: int | None, timed_out: bool = False) -> tuple[int, str]:
    if timed_out:
        return -1, "timeout"
    if code is None or code < 0:
        return -1, "signal: killed"
    return code, f"exit status {code}"


class E2BProcess:
    """One command or PTY the SDK started, relayed to the streams listening to it.

    Agent-held ones are made per stream (`held_by_agent`): each start or connect relays its
    own attachment and detaches at its end. Cloud ones live in `local_processes` and keep
    relaying until the process ends."""

    def __init__(
        self, sandbox_id: str, config: pb.ProcessConfig, tag: str | None, pid: int = 0
    ) -> None:
        self.sandbox_id = sandbox_id
        self.config = config
        self.tag = tag
        self.pid = pid
        self.session_id: str | None = None
        """The agent's id of the run or terminal; None for a cloud provider's."""
        self.stream: ExecStream | None = None
        self.session: TerminalSession | None = None
        self.end: tuple[int, str] | None = None
        self._listeners: set[asyncio.Queue[Event]] = set()
        self._fd = -1

    @property
    def held_by_agent(self) -> bool:
        return self.session_id is not None

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
        self._stop_reading()
        self.publish(("end", self.end))
        local_processes.pop(self)
        stream, self.stream = self.stream, None
        if stream is not None:
            stream.close()  # it has ended: nothing left to kill, only the connection

    # -- a command: its ExecStream read on the loop ----------------------------------------

    def follow(self, stream: ExecStream) -> None:
        self.stream = stream
        self.pid = stream.pid
        self.session_id = getattr(stream, "session_id", None)
        loop = asyncio.get_running_loop()
        self._fd = stream.fileno()
        loop.add_reader(self._fd, self._on_readable)
        # Events may be buffered already (a command that ended while it started).
        loop.call_soon(self._on_readable)

    def _on_readable(self) -> None:
        stream = self.stream
        if stream is None:
            return
        try:
            events = stream.read_events()
        except BlockingIOError:
            return
        for event in events:
            if event.type == "exit":
                self.finish(*_end_of(event.exit_code, event.timed_out))
                return
            self.publish((event.type, event.data))

    def _stop_reading(self) -> None:
        if self._fd >= 0:
            try:
                asyncio.get_running_loop().remove_reader(self._fd)
            except (ValueError, OSError, RuntimeError):
                pass
            self._fd = -1

    # -- a PTY: TerminalClient ---------------------------------------------------------------

    def terminal_output(self, data: bytes) -> None:
        self.publish(("pty", data))

    def terminal_exited(self, code: int | None) -> None:
        self.finish(*_end_of(code))

    def detach(self) -> None:
        """An agent-held process's stream ended: hang up, the process goes on."""
        if not self.held_by_agent or self.end is not None:
            return
        self._stop_reading()
        stream, self.stream = self.stream, None
        if stream is not None:
            detach = getattr(stream, "detach", None)
            if detach is not None:
                detach()
        if self.session is not None:
            self.session.terminal.detach(self)


class LocalProcesses:
    """The processes a cloud provider runs for the SDK, started through this web process,
    by (sandbox id, pid)."""

    def __init__(self) -> None:
        self._processes: dict[tuple[str, int], E2BProcess] = {}

    def add(self, process: E2BProcess) -> None:
        self._processes[(process.sandbox_id, process.pid)] = process

    def pop(self, process: E2BProcess) -> None:
        key = (process.sandbox_id, process.pid)
        if self._processes.get(key) is process:
            del self._processes[key]

    def for_sandbox(self, sandbox_id: str) -> list[E2BProcess]:
        return [p for (sid, _), p in self._processes.items() if sid == sandbox_id]


local_processes = LocalProcesses()


# --- what the agent keeps -------------------------------------------------------------------


def _meta(config: pb.ProcessConfig, tag: str | None) -> dict[str, Any]:
    """What commands.list shows of a process, kept with it in the agent."""
    meta: dict[str, Any] = {
        "cmd": config.cmd,
        "args": list(config.args),
        "envs": dict(config.envs),
        "cwd": config.cwd if config.has_field("cwd") else None,
        "tag": tag,
    }
    for dropped in ("envs", "args"):
        if len(json.dumps(meta)) <= MAX_META_BYTES:
            break
        meta[dropped] = {} if dropped == "envs" else []
    meta["cmd"] = str(meta["cmd"])[:1000]
    return {META_KEY: meta}


def _config(meta: dict[str, Any]) -> pb.ProcessConfig:
    config = pb.ProcessConfig(
        cmd=str(meta.get("cmd") or ""),
        args=[str(a) for a in meta.get("args") or []],
        envs={str(k): str(v) for k, v in (meta.get("envs") or {}).items()},
    )
    if isinstance(meta.get("cwd"), str):
        config.cwd = meta["cwd"]
    return config


def _e2b(info: SessionInfo) -> dict[str, Any] | None:
    meta = info.meta.get(META_KEY)
    return meta if isinstance(meta, dict) else None


def _selected(pid: int, tag: str | None, selector: pb.ProcessSelector | None) -> bool:
    chosen = selector.selector if selector is not None else None
    if chosen is None:
        return False
    return (chosen.field == "pid" and pid == chosen.value) or (
        chosen.field == "tag" and tag is not None and tag == chosen.value
    )


async def _agent_running(sandbox: Sandbox) -> list[SessionInfo]:
    sessions = await call(sandbox_sessions_list, sandbox=sandbox) or []
    return [s for s in sessions if s.running and _e2b(s) is not None]


def _local_find(sandbox: Sandbox, selector: pb.ProcessSelector | None) -> E2BProcess | None:
    for process in local_processes.for_sandbox(sandbox.id):
        if _selected(process.pid, process.tag, selector):
            return process
    return None


def _agent_find(*, sandbox: Sandbox, selector: pb.ProcessSelector | None) -> SessionInfo:
    """The agent's running session a selector names (pid or tag); NOT_FOUND otherwise.
    Synchronous (an agent round trip)."""
    for info in sandbox_sessions_list(sandbox=sandbox) or []:
        meta = _e2b(info)
        if info.running and meta is not None and _selected(info.pid, meta.get("tag"), selector):
            return info
    raise ConnectError(Code.NOT_FOUND, "process not found")


def _agent_input(*, caller: Caller, sandbox: Sandbox, found: SessionInfo, payload: bytes) -> None:
    """Input to an agent-held PTY (the terminal rule) or command (one 'exec.stdin')."""
    if found.kind == "pty":
        e2b_pty_input(caller=caller, sandbox=sandbox, session_id=found.id, data=payload)
    else:
        sandbox_exec_stream_stdin(caller=caller)
        sandbox_session_send(sandbox=sandbox, session_id=found.id, kind="stdin", payload=payload)


def _agent_find_and_input(
    *, caller: Caller, sandbox: Sandbox, selector: pb.ProcessSelector | None, payload: bytes
) -> None:
    # One hop to the ORM thread for the lookup, the count and the send (each hop costs).
    _agent_input(
        caller=caller,
        sandbox=sandbox,
        found=_agent_find(sandbox=sandbox, selector=selector),
        payload=payload,
    )


async def _find(sandbox: Sandbox, selector: pb.ProcessSelector | None) -> SessionInfo | E2BProcess:
    """The running process a selector names (pid or tag): this process's cloud one, or the
    agent's session; NOT_FOUND otherwise."""
    local = _local_find(sandbox, selector)
    if local is not None:
        return local
    return await call(_agent_find, sandbox=sandbox, selector=selector)


# --- streams ----------------------------------------------------------------------------------


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
        process.detach()


def _timeout_s(ctx: RequestContext[Any, Any]) -> float | None:
    remaining = ctx.timeout_ms
    return remaining / 1000 if remaining else None


async def _attach_pty(
    caller: Caller, sandbox: Sandbox, process: E2BProcess, terminal_id: str
) -> None:
    """Relay the terminal to `process` (an agent's replays its scrollback first)."""
    session = await call(terminal_attach, caller=caller, sandbox=sandbox, terminal_id=terminal_id)
    if session is None:  # killed in between
        raise ConnectError(Code.NOT_FOUND, "the terminal has ended")
    process.session = session
    if isinstance(session.terminal, AgentTerminal):
        process.session_id = session.terminal.id
        process.pid = process.pid or session.terminal.link.info.pid
    scrollback = session.terminal.attach(process)
    if scrollback:
        process.publish(("pty", scrollback))


class ProcessService(Process):
    """process.Process for the SDK's commands and pty modules."""

    async def _start_command(
        self, caller: Caller, sandbox: Sandbox, request: pb.StartRequest, ctx: Any
    ) -> E2BProcess:
        config = request.process or pb.ProcessConfig()
        tag = request.tag if request.has_field("tag") else None
        stream = await call(
            sandbox_exec_stream_open,
            caller=caller,
            sandbox=sandbox,
            argv=[config.cmd, *config.args],
            operation="exec.command",
            cwd=translate.sandbox_cwd(config.cwd if config.has_field("cwd") else None),
            env=dict(config.envs),
            timeout_s=_timeout_s(ctx),
            meta=_meta(config, tag),
            detached=True,
        )
        process = E2BProcess(sandbox.id, config, tag)
        process.follow(stream)
        if not process.held_by_agent:
            local_processes.add(process)
        if not (request.has_field("stdin") and request.stdin):
            stream.close_stdin()  # E2B closes stdin unless asked to keep it
        return process

    async def _start_pty(
        self, caller: Caller, sandbox: Sandbox, request: pb.StartRequest
    ) -> E2BProcess:
        config = request.process or pb.ProcessConfig()
        tag = request.tag if request.has_field("tag") else None
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
            meta=_meta(config, tag),
        )
        process = E2BProcess(sandbox.id, config, tag)
        await _attach_pty(caller, sandbox, process, terminal.id)
        if not process.held_by_agent:
            process.pid = next(_cloud_pty_pids)
            local_processes.add(process)
        return process

    async def start(
        self, request: pb.StartRequest, ctx: RequestContext[Any, Any]
    ) -> AsyncIterator[pb.StartResponse]:
        caller, sandbox = await envd_caller(ctx)
        if request.pty is not None:
            process = await self._start_pty(caller, sandbox, request)
        else:
            process = await self._start_command(caller, sandbox, request, ctx)
        # A command's own timeout (the same deadline) ends it with its end event.
        grace_s = COMMAND_END_GRACE_S if request.pty is None else 0.0
        events = _stream(process, process.listen(), pb.StartResponse)
        async for response in within_deadline(ctx, events, grace_s=grace_s):
            yield response

    async def connect(
        self, request: pb.ConnectRequest, ctx: RequestContext[Any, Any]
    ) -> AsyncIterator[pb.ConnectResponse]:
        """Attach to a running process's output from now on (not counted: runs nothing)."""
        caller, sandbox = await envd_caller(ctx)
        found = await _find(sandbox, request.process)
        if isinstance(found, E2BProcess):
            process = found
        else:
            meta = _e2b(found) or {}
            process = E2BProcess(sandbox.id, _config(meta), meta.get("tag"), pid=found.pid)
            if found.kind == "pty":
                await _attach_pty(caller, sandbox, process, found.id)
            else:
                stream = await call(
                    sandbox_exec_stream_attach,
                    caller=caller,
                    sandbox=sandbox,
                    session_id=found.id,
                    since=found.offset,
                )
                process.follow(stream)
        events = _stream(process, process.listen(), pb.ConnectResponse)
        async for response in within_deadline(ctx, events):
            yield response

    async def list(self, request: pb.ListRequest, ctx: RequestContext[Any, Any]) -> pb.ListResponse:
        """The running commands and PTYs the SDK started (not counted: reads)."""
        _, sandbox = await envd_caller(ctx)
        found = [
            pb.ProcessInfo(config=p.config, pid=p.pid, tag=p.tag)
            for p in local_processes.for_sandbox(sandbox.id)
        ]
        for info in await _agent_running(sandbox):
            meta = _e2b(info) or {}
            found.append(pb.ProcessInfo(config=_config(meta), pid=info.pid, tag=meta.get("tag")))
        return pb.ListResponse(processes=found)

    async def _send(
        self,
        caller: Caller,
        sandbox: Sandbox,
        found: SessionInfo | E2BProcess,
        data: pb.ProcessInput,
    ) -> None:
        chosen = data.input
        if chosen is None or not chosen.value:
            return
        payload: bytes = chosen.value
        if isinstance(found, SessionInfo):
            await call(_agent_input, caller=caller, sandbox=sandbox, found=found, payload=payload)
        elif found.session is not None:
            # A PTY counts by the terminal rule (each Enter, at least one per window).
            found.session.write(payload)
            first, count = found.session.take()
            await call(found.session.flush, first=first, count=count)
        elif found.stream is not None:
            await call(sandbox_exec_stream_stdin, caller=caller)
            found.stream.write_stdin(payload)

    async def send_input(
        self, request: pb.SendInputRequest, ctx: RequestContext[Any, Any]
    ) -> pb.SendInputResponse:
        caller, sandbox = await envd_caller(ctx)
        data = request.input or pb.ProcessInput()
        local = _local_find(sandbox, request.process)
        if local is not None:
            await self._send(caller, sandbox, local, data)
        elif data.input is not None and data.input.value:
            await call(
                _agent_find_and_input,
                caller=caller,
                sandbox=sandbox,
                selector=request.process,
                payload=data.input.value,
            )
        else:
            await _find(sandbox, request.process)  # NOT_FOUND for nothing sent to nothing
        return pb.SendInputResponse()

    async def stream_input(
        self, request: AsyncIterator[pb.StreamInputRequest], ctx: RequestContext[Any, Any]
    ) -> pb.StreamInputResponse:
        caller, sandbox = await envd_caller(ctx)
        found: SessionInfo | E2BProcess | None = None
        async for message in request:
            event = message.event
            if event is None:
                continue
            if event.field == "start":
                found = await _find(sandbox, event.value.process)
            elif event.field == "data":
                if found is None:
                    raise ConnectError(Code.INVALID_ARGUMENT, "start the stream first")
                await self._send(caller, sandbox, found, event.value.input or pb.ProcessInput())
        return pb.StreamInputResponse()

    async def send_signal(
        self, request: pb.SendSignalRequest, ctx: RequestContext[Any, Any]
    ) -> pb.SendSignalResponse:
        caller, sandbox = await envd_caller(ctx)
        number = int(request.signal) or 15
        try:
            found = await _find(sandbox, request.process)
        except ConnectError:
            chosen = request.process.selector if request.process else None
            if chosen is None or chosen.field != "pid":
                raise
            # Not one the SDK started: signal the sandbox's process by pid.
            await call(
                sandbox_process_signal,
                caller=caller,
                sandbox=sandbox,
                pid=chosen.value,
                signal=number,
            )
            return pb.SendSignalResponse()
        if isinstance(found, SessionInfo):
            if found.kind == "pty":
                await call(terminal_kill, caller=caller, sandbox=sandbox, terminal_id=found.id)
            else:
                await call(e2b_run_signal_authorize, caller=caller, number=number)
                await call(
                    sandbox_session_send,
                    sandbox=sandbox,
                    session_id=found.id,
                    kind="signal",
                    payload=str(number).encode(),
                )
        elif found.session is not None:
            terminal_id = found.session.terminal.id
            await call(terminal_kill, caller=caller, sandbox=sandbox, terminal_id=terminal_id)
            found.finish(-1, "signal: killed")
        elif found.stream is not None:
            await call(e2b_run_signal_authorize, caller=caller, number=number)
            found.stream.signal(number)
        return pb.SendSignalResponse()

    async def close_stdin(
        self, request: pb.CloseStdinRequest, ctx: RequestContext[Any, Any]
    ) -> pb.CloseStdinResponse:
        """End of input (not counted, as on the exec socket)."""
        _, sandbox = await envd_caller(ctx)
        found = await _find(sandbox, request.process)
        if isinstance(found, SessionInfo):
            if found.kind == "exec":
                await call(
                    sandbox_session_send, sandbox=sandbox, session_id=found.id, kind="close_stdin"
                )
        elif found.stream is not None:
            found.stream.close_stdin()
        return pb.CloseStdinResponse()

    async def update(
        self, request: pb.UpdateRequest, ctx: RequestContext[Any, Any]
    ) -> pb.UpdateResponse:
        """Resize a PTY (counted once, 'terminal.resize')."""
        caller, sandbox = await envd_caller(ctx)
        found = await _find(sandbox, request.process)
        if isinstance(found, SessionInfo):
            terminal_id = found.id if found.kind == "pty" else None
        else:
            terminal_id = found.session.terminal.id if found.session is not None else None
        if terminal_id is None:
            raise ConnectError(Code.INVALID_ARGUMENT, "only a PTY can be resized")
        size = request.pty.size if request.pty and request.pty.size else None
        if size is not None:
            await call(
                terminal_resize,
                caller=caller,
                sandbox=sandbox,
                terminal_id=terminal_id,
                cols=size.cols,
                rows=size.rows,
            )
        return pb.UpdateResponse()
