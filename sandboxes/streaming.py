"""Services of the live operations: streamed runs, file watchers, event subscriptions and
port connections (the exec and events sockets and the preview proxy call these).

Same door as every other sandbox operation (sandboxes.caller): scope, billing authorization,
the provider call, one usage record. What differs is timing: a streamed run or a preview is
counted when it starts, a watcher once it watches, a preview WebSocket once the server in
the sandbox accepted it.
"""

from __future__ import annotations

import base64
import json
import select
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async

from common.errors import ApplicationError, NotFound

from .activity import sandbox_touch_id
from .agent_sessions import (
    AgentRunStream,
    AgentSessions,
    AgentWatch,
    SessionInfo,
    check_id,
    frame,
    sandbox_cwd,
    session_attach,
    session_kill,
    session_list,
    session_open,
    supports_sessions,
)
from .caller import Caller, billing_allows, billing_authorize, billing_record, metered
from .code_services import code_stream_argv
from .models import Sandbox, SandboxState
from .programs import exec_runner
from .provider_access import provider_for, require_capability
from .providers.base import (
    Capability,
    ExecEvent,
    ExecRequest,
    ExecStream,
    FileEvent,
    InvalidRequest,
    PortStream,
    ProcessNotFound,
    ProviderError,
    PtySession,
    SandboxGone,
    SandboxProvider,
    StreamingProvider,
)
from .watchers import FileWatcher, WatchSpec, coalesce_events, sandbox_pollers

__all__ = [  # the provider types a streaming interface handles, re-exported
    "ExecEvent",
    "ExecStream",
    "InvalidRequest",
    "PortStream",
    "ProviderError",
    "PtySession",
]

EXEC_RUNNER_SOURCE = Path(exec_runner.__file__).read_text()
"""The runner program, handed to the sandbox's python3 in an environment variable."""
EXEC_LAUNCH = b'exec python3 -I -S -c "$SANDPIT_RUNNER"\n'
READY_MARK = exec_runner.READY_MARK
RUNNER_START_TIMEOUT_S = 30.0
"""How long the runner may take to start the command (python3 starting in the sandbox)."""
EXEC_ORPHAN_S = 60.0
"""A run in the agent whose web process died (no goodbye: a closed socket cancels its runs)
keeps running this long for a reattach (`sandbox_exec_stream_attach`), then is killed."""
WATCH_ORPHAN_S = 60.0
"""The same for a watch: its records are kept for a reattach (`sandbox_watch_resume`)."""
POLLED_WATCH_ORPHAN_S = 600.0
"""A polled watch (`sandbox_watch_open_polled`) has nobody attached between two polls: it
records this long after the last one, then ends."""
POLL_QUIET_S = 0.05
"""A poll returns once the watch has been quiet this long."""
UNTIMED_RUN_S = 7 * 24 * 3600.0
"""The timeout handed to exec_stream for a run without one: it lasts as long as its
sandbox, but the agent wants a number (and poll() a finite one)."""


# --- streamed runs (the exec socket) -----------------------------------------------------------


def exec_stream_argv(
    *,
    command: object = None,
    args: Sequence[object] | None = None,
    code: object = None,
    language: str | None = None,
    sandbox: Sandbox | None = None,
) -> tuple[list[str], str]:
    """The argv of a streamed run and its usage operation ('exec.code' or 'exec.command').
    `code` (run in `sandbox`'s toolchain for its language, compiled first when it is)
    wins over `command`; `args is None` → `sh -c command`. ApplicationError
    'unknown_language', 'language_unavailable' or 'invalid_message' (400). Synchronous
    (the first run of an environment probes it): call from a thread."""
    if code is not None:
        if sandbox is None:
            raise ApplicationError("run needs a sandbox for 'code'.", code="invalid_message")
        return code_stream_argv(sandbox, str(code), language), "exec.code"
    if not isinstance(command, str) or not command:
        raise ApplicationError("run needs 'command' or 'code'.", code="invalid_message")
    if args is None:
        return ["sh", "-c", command], "exec.command"
    return [command, *[str(a) for a in args]], "exec.command"


class RunnerExecStream:
    """An ExecStream for a provider without `exec_stream`: sandboxes/programs/exec_runner.py
    on a PTY in the sandbox, its frames turned into ExecEvents.

    Made by `open`, which returns once the runner has started the command (its pid known),
    so nothing is ever written to the PTY before the runner switched it to raw mode. Frames
    already read are kept: call `read_events` once without waiting for `fileno()`."""

    def __init__(self, pty: PtySession) -> None:
        self._pty = pty
        self.pid = 0
        self._buffer = b""
        self._events: list[ExecEvent] = []
        self._ended = False

    @classmethod
    def open(
        cls,
        provider: SandboxProvider,
        provider_id: str,
        *,
        argv: Sequence[str],
        cwd: str | None,
        env: Mapping[str, str],
        timeout_s: float | None,
        start_timeout_s: float = RUNNER_START_TIMEOUT_S,
    ) -> RunnerExecStream:
        """Start `argv` under the runner on a new PTY in the sandbox; returns once the
        runner has started it (or reported that it could not: 127). Raises the provider's
        errors, ProviderError when the runner does not start in `start_timeout_s` (the
        PTY is closed then). Synchronous."""
        spec = {"argv": list(argv), "cwd": cwd, "env": dict(env), "timeout_s": timeout_s}
        pty = provider.open_pty(  # noqa: S604 - a fixed shell, not user input
            provider_id,
            cols=200,
            rows=50,
            shell="/bin/sh",
            env={"SANDPIT_RUNNER": EXEC_RUNNER_SOURCE, "SANDPIT_EXEC": json.dumps(spec)},
        )
        stream = cls(pty)
        try:
            pty.write(EXEC_LAUNCH)
            deadline = time.monotonic() + start_timeout_s
            while not stream._ended and stream.pid <= 0:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ProviderError("the command runner did not start in the sandbox")
                select.select([pty.fileno()], [], [], remaining)
                try:
                    stream._pull()
                except BlockingIOError:
                    continue
        except BaseException:
            pty.close()
            raise
        return stream

    def fileno(self) -> int:
        return self._pty.fileno()

    def read_events(self) -> list[ExecEvent]:
        """What has arrived (non-blocking); raises BlockingIOError when nothing has. The
        last event is 'exit' (exit_code None when the PTY ended without the runner's exit
        frame); after it, []."""
        if not self._events and not self._ended:
            self._pull()
        if not self._events and not self._ended:
            raise BlockingIOError
        events, self._events = self._events, []
        return events

    def _pull(self) -> None:
        """Read what the PTY has (BlockingIOError when nothing) and parse whole frames."""
        data = self._pty.read(65536)
        if not data:
            self._end(ExecEvent("exit"))
            return
        self._buffer += data
        if not self.pid:
            mark = self._buffer.find(READY_MARK)
            if mark < 0:
                # What the PTY echoed of the launch line; keep a tail the mark may start in.
                self._buffer = self._buffer[-len(READY_MARK) :]
                return
            self._buffer = self._buffer[mark + len(READY_MARK) :]
            self.pid = -1  # raw mode is on; the start frame gives the real pid
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            kind, _, payload = line.strip(b"\r").partition(b" ")
            try:
                value = base64.b64decode(payload)
            except ValueError:
                continue
            if kind == b"O":
                self._events.append(ExecEvent("stdout", value))
            elif kind == b"E":
                self._events.append(ExecEvent("stderr", value))
            elif kind == b"S":
                self.pid = int(value or 0)
            elif kind in (b"X", b"T"):
                self._end(ExecEvent("exit", exit_code=int(value or -1), timed_out=kind == b"T"))
                return

    def _end(self, event: ExecEvent) -> None:
        self._ended = True
        self._events.append(event)
        self._buffer = b""
        if self.pid < 0:
            self.pid = 0

    def _send(self, frame: bytes) -> None:
        if self._ended:
            return
        try:
            self._pty.write(frame)
        except SandboxGone:
            pass  # the command has ended; its exit frame (or the PTY's end) tells the rest

    def write_stdin(self, data: bytes) -> None:
        self._send(b"I " + base64.b64encode(data) + b"\n")

    def close_stdin(self) -> None:
        self._send(b"C \n")

    def signal(self, signal: int) -> None:
        self._send(b"K " + str(int(signal)).encode() + b"\n")

    def close(self) -> None:
        """Kill the command's tree (closing the PTY session kills everything in it)."""
        self._ended = True
        self._pty.close()


def sandbox_exec_stream_open(
    *,
    caller: Caller,
    sandbox: Sandbox,
    argv: Sequence[str],
    operation: str,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
    meta: Mapping[str, Any] | None = None,
    detached: bool = False,
) -> ExecStream:
    """Start one streamed run, counted once as `operation`. The provider's own exec_stream
    where it has one (the in-sandbox agent frames the output and the exit status), else
    the runner on a PTY (RunnerExecStream). `timeout_s` None: no timeout. Where the run
    lives in the agent, `meta` (a small JSON object) is listed with it
    (`sandbox_sessions_list`) and `detached` lets it run on with nobody attached (as a
    process E2B's SDK starts does) instead of for EXEC_ORPHAN_S. Call
    `read_events` once without waiting for `fileno()`: events may already be buffered.
    Raises PaymentRequired (402), ApplicationError 'sandbox_not_running',
    CapabilityNotSupported and the provider's errors. Synchronous: call from a thread."""
    stream: ExecStream | None = None
    try:
        with metered(caller, feature="exec", operation=operation, scope="exec"):
            if sandbox.state != SandboxState.RUNNING:
                raise ApplicationError("The sandbox is not running.", code="sandbox_not_running")
            provider = provider_for(sandbox)
            agent = provider if supports_sessions(provider) else None
            if agent is not None:
                # The run lives in the agent: any web process can reattach to it.
                require_capability(provider, Capability.EXEC)
                _info, link = session_open(
                    agent,
                    sandbox.provider_id,
                    kind="exec",
                    argv=list(argv),
                    cwd=sandbox_cwd(cwd),
                    env=env,
                    timeout_s=timeout_s,
                    orphan_s=None if detached else EXEC_ORPHAN_S,
                    meta=meta,
                    attach=True,
                )
                assert link is not None
                stream = AgentRunStream(link)
            elif isinstance(provider, StreamingProvider):
                require_capability(provider, Capability.EXEC)
                request = ExecRequest(
                    command=argv[0],
                    args=list(argv[1:]),
                    cwd=cwd,
                    env=dict(env or {}),
                    timeout_s=timeout_s or UNTIMED_RUN_S,
                )
                stream = provider.exec_stream(sandbox.provider_id, request)
            else:
                require_capability(provider, Capability.PTY)
                stream = RunnerExecStream.open(
                    provider,
                    sandbox.provider_id,
                    argv=argv,
                    cwd=cwd,
                    env=dict(env or {}),
                    timeout_s=timeout_s,
                )
    except BaseException:
        if stream is not None:
            stream.close()  # started but not counted (the usage record failed): not kept
        raise
    sandbox_touch_id(sandbox.id)
    return stream


def sandbox_exec_stream_attach(
    *, caller: Caller, sandbox: Sandbox, session_id: str, since: int = 0
) -> ExecStream:
    """Reattach to a streamed run started through any web process (its `session` id): its
    buffered output from byte `since`, then live events, then its exit. Not counted (the
    run was, when it started). ApplicationError 'run_not_found' when the sandbox's agent
    does not know it (ended more than a few minutes ago, or a provider without sessions).
    Synchronous: call from a thread."""
    caller.require_scope("exec")
    billing_authorize(caller, "exec")
    not_found = NotFound("No such run in this sandbox.", code="run_not_found")
    if sandbox.state != SandboxState.RUNNING or not session_id.startswith("run_"):
        raise not_found
    provider = provider_for(sandbox)
    if not supports_sessions(provider):
        raise not_found
    try:
        link = session_attach(provider, sandbox.provider_id, check_id(session_id), since)
    except ProviderError:
        raise not_found from None
    if link.info.kind != "exec":
        link.close()
        raise not_found
    return AgentRunStream(link)


def sandbox_sessions_list(*, sandbox: Sandbox) -> list[SessionInfo] | None:
    """The terminals and runs the sandbox's agent holds (running and recently ended ones,
    oldest first, with the `meta` they were started with), whichever web process started
    them; None when the sandbox's provider runs no agent. Not counted (reads). Raises the
    provider's errors. Synchronous: call from a thread."""
    if sandbox.state != SandboxState.RUNNING or not sandbox.provider_id:
        return None
    provider = provider_for(sandbox)
    if not supports_sessions(provider):
        return None
    return [s for s in session_list(provider, sandbox.provider_id) if s.kind in ("pty", "exec")]


SESSION_FRAMES = {"stdin": b"I", "close_stdin": b"C", "signal": b"K"}


def sandbox_session_send(
    *, sandbox: Sandbox, session_id: str, kind: str, payload: bytes = b""
) -> None:
    """Hand one frame to an agent-held terminal or run (`kind`: 'stdin', 'close_stdin',
    'signal' with the number as text) through a connection of its own, closed once the
    frame is sent: the agent reads it even from a link already closed (its sessions.py
    `_last_frames`), and input sent by one call arrives before the next call's. Not
    counted: the caller counted it first (sandbox_exec_stream_stdin, the terminal rule,
    a signal's service). ProcessNotFound when the agent does not know the session.
    Synchronous: call from a thread."""
    provider = provider_for(sandbox)
    if not supports_sessions(provider):
        raise NotFound("No such run in this sandbox.", code="run_not_found")
    # No replay: attach from past any offset the session can reach.
    link = session_attach(provider, sandbox.provider_id, check_id(session_id), since=1 << 62)
    try:
        link.sock.setblocking(True)
        for start in range(0, max(1, len(payload)), 65536):
            link.sock.sendall(frame(SESSION_FRAMES[kind], payload[start : start + 65536]))
    except OSError as exc:
        raise ProviderError(f"lost the sandbox agent: {exc!r}") from None
    finally:
        link.close()


def sandbox_exec_stream_stdin(*, caller: Caller) -> None:
    """Authorize and count one stdin message to a streamed run (input to a running program
    can be a whole new command: a shell reading its stdin). The caller sends the data once
    this returns. Raises PaymentRequired (402). Synchronous: call from a thread."""
    with metered(caller, feature="exec", operation="exec.stdin", scope="exec"):
        pass


# --- the events socket -----------------------------------------------------------------------------


def sandbox_events_ports_allowed(*, caller: Caller) -> bool:
    """Whether the caller may receive port events (scope 'ports' and the Premium feature).
    Not counted. Synchronous: call from a thread."""
    principal = caller.principal
    if principal is None or not principal.has_scope("ports"):
        return False
    return billing_allows(caller, "ports")


def sandbox_events_subscribe(
    *, sandbox: Sandbox, deliver: Callable[[dict[str, Any]], None], ports: bool
) -> bool:
    """Deliver the sandbox's process (and, with `ports`, port) events to `deliver` on this
    loop. Not counted: it polls Sandpit's view of the sandbox. Returns whether it subscribed
    (False: the sandbox is not running or its provider is not configured)."""
    if sandbox.state != SandboxState.RUNNING or not sandbox.provider_id:
        return False
    try:
        provider = provider_for(sandbox)
    except ProviderError:
        return False
    sandbox_pollers.subscribe(
        sandbox_id=sandbox.id,
        provider=provider,
        provider_id=sandbox.provider_id,
        deliver=deliver,
        ports=ports,
    )
    return True


def sandbox_events_unsubscribe(
    *, sandbox: Sandbox, deliver: Callable[[dict[str, Any]], None]
) -> None:
    sandbox_pollers.unsubscribe(sandbox.id, deliver)


async def sandbox_watch_start(
    *,
    caller: Caller,
    sandbox: Sandbox,
    watcher_id: Callable[[], str],
    spec: WatchSpec,
    deliver: Callable[[dict[str, Any]], None],
) -> FileWatcher:
    """Start a file watcher delivering to `deliver` on this loop; counted once
    ('watch.create') when it watches. `watcher_id` names it once it may start. Where the
    provider runs the agent the watch lives there (its `session` id can be resumed
    through any web process, `sandbox_watch_resume`). A coroutine because the watcher
    lives on the loop; the billing steps run in threads. Raises PaymentRequired (402),
    ApplicationError 'sandbox_not_running', CapabilityNotSupported and the provider's
    errors."""
    caller.require_scope("files")
    await database_sync_to_async(billing_authorize)(caller, "watch")
    if sandbox.state != SandboxState.RUNNING:
        raise ApplicationError("The sandbox is not running.", code="sandbox_not_running")
    provider = provider_for(sandbox)
    require_capability(provider, Capability.WATCH)
    opener = None
    agent = provider if supports_sessions(provider) else None
    if agent is not None:

        def opener() -> AgentWatch:
            return _agent_watch_open(agent, sandbox.provider_id, spec, WATCH_ORPHAN_S)[1]

    watcher = FileWatcher(
        watcher_id=watcher_id(),
        provider=provider,
        provider_id=sandbox.provider_id,
        spec=spec,
        deliver=deliver,
        opener=opener,
    )
    await watcher.start()
    await database_sync_to_async(billing_record)(caller, "watch.create")
    return watcher


async def sandbox_watch_resume(
    *,
    caller: Caller,
    sandbox: Sandbox,
    session_id: str,
    since: int,
    watcher_id: str,
    spec: WatchSpec,
    deliver: Callable[[dict[str, Any]], None],
) -> FileWatcher:
    """Reattach to a watch started through any web process (its `session` id): the
    records it buffered after byte `since`, then live ones. Its path and recursion are the
    watch's own; `spec`'s ignore and debounce apply. Not counted again (it was when it
    started). NotFound 'watcher_not_found' when the sandbox's agent does not know it."""
    caller.require_scope("files")
    await database_sync_to_async(billing_authorize)(caller, "watch")
    not_found = NotFound("No such watch in this sandbox.", code="watcher_not_found")
    if sandbox.state != SandboxState.RUNNING or not session_id.startswith("watch_"):
        raise not_found
    provider = provider_for(sandbox)
    agent = provider if supports_sessions(provider) else None
    if agent is None:
        raise not_found

    def opener() -> AgentWatch:
        return _agent_watch_attach(agent, sandbox.provider_id, session_id, since, not_found)

    watcher = FileWatcher(
        watcher_id=watcher_id,
        provider=provider,
        provider_id=sandbox.provider_id,
        spec=spec,
        deliver=deliver,
        opener=opener,
    )
    await watcher.start()
    return watcher


def _agent_watch_open(
    agent: AgentSessions, provider_id: str, spec: WatchSpec, orphan_s: float
) -> tuple[SessionInfo, AgentWatch]:
    """A watch session in the sandbox's agent, its watches in place when this returns."""
    info, link = session_open(
        agent,
        provider_id,
        kind="watch",
        argv=[],
        cwd=None,
        env=None,
        orphan_s=orphan_s,
        attach=True,
        path=spec.path,
        recursive=spec.recursive,
    )
    assert link is not None
    watch = AgentWatch(link)
    try:
        watch.wait_ready()
    except BaseException:
        watch.close()
        raise
    return info, watch


def _agent_watch_attach(
    agent: AgentSessions, provider_id: str, session_id: str, since: int, not_found: NotFound
) -> AgentWatch:
    """The agent's watch `session_id` from byte `since`; `not_found` if it has none."""
    try:
        link = session_attach(agent, provider_id, check_id(session_id), since)
    except ProviderError:
        raise not_found from None
    if link.info.kind != "watch":
        link.close()
        raise not_found
    return AgentWatch(link)


def sandbox_watch_open_polled(
    *, caller: Caller, sandbox: Sandbox, spec: WatchSpec
) -> tuple[str, int] | None:
    """Start a watch that the sandbox's agent holds with nobody attached, its records
    waiting for `sandbox_watch_poll` from any web process (E2B's polled watchers): counted
    once ('watch.create'). Returns its session id and the offset its first poll reads
    from; None when the provider runs no agent (the caller watches in its own process,
    `sandbox_watch_start`). It ends POLLED_WATCH_ORPHAN_S after the last poll, on
    `sandbox_watch_stop`, or with the sandbox. Raises PaymentRequired (402),
    ApplicationError 'sandbox_not_running', CapabilityNotSupported and the provider's
    errors. Synchronous: call from a thread."""
    caller.require_scope("files")
    if sandbox.state != SandboxState.RUNNING:
        raise ApplicationError("The sandbox is not running.", code="sandbox_not_running")
    provider = provider_for(sandbox)
    agent = provider if supports_sessions(provider) else None
    if agent is None:
        return None
    with metered(caller, feature="watch", operation="watch.create", scope="files"):
        require_capability(provider, Capability.WATCH)
        info, watch = _agent_watch_open(agent, sandbox.provider_id, spec, POLLED_WATCH_ORPHAN_S)
        try:
            watch.drain(0)  # past the ready mark
        except BaseException:
            watch.close()
            raise
        watch.detach()
    return info.id, watch.offset


def sandbox_watch_poll(
    *, caller: Caller, sandbox: Sandbox, session_id: str, since: int
) -> tuple[list[FileEvent], int]:
    """What a polled watch recorded after byte `since` (coalesced per path, as a watcher's
    batch), and the offset to poll from next. Not counted (reads what the watch
    collected). NotFound 'watcher_not_found' when the agent does not know it (stopped,
    orphaned, or never was). Synchronous: call from a thread."""
    caller.require_scope("files")
    not_found = NotFound("No such watch in this sandbox.", code="watcher_not_found")
    if sandbox.state != SandboxState.RUNNING or not session_id.startswith("watch_"):
        raise not_found
    provider = provider_for(sandbox)
    if not supports_sessions(provider):
        raise not_found
    watch = _agent_watch_attach(provider, sandbox.provider_id, session_id, since, not_found)
    try:
        events = coalesce_events(watch.drain(POLL_QUIET_S))
    finally:
        watch.detach()
    return events, watch.offset


def sandbox_watch_stop(*, caller: Caller, sandbox: Sandbox, session_id: str) -> None:
    """End a polled watch (not counted: stopping). NotFound 'watcher_not_found'.
    Synchronous: call from a thread."""
    caller.require_scope("files")
    provider = provider_for(sandbox)
    if not session_id.startswith("watch_") or not supports_sessions(provider):
        raise NotFound("No such watch in this sandbox.", code="watcher_not_found")
    try:
        session_kill(provider, sandbox.provider_id, check_id(session_id))
    except ProcessNotFound:
        raise NotFound("No such watch in this sandbox.", code="watcher_not_found") from None


# --- port previews -----------------------------------------------------------------------------------


async def sandbox_port_open(
    *, caller: Caller, sandbox: Sandbox, port: int, operation: str | None
) -> PortStream:
    """A byte stream to `port` inside the sandbox (works without sandbox network). Billing
    must allow 'ports'; counted once as `operation` when connected (None: not counted here,
    a preview WebSocket is counted by sandbox_port_websocket_opened). A coroutine: billing
    runs in the ORM thread, the connect in a thread of its own (it may take a while on a
    cloud provider). Raises PaymentRequired (402), ProviderError (not running; InvalidRequest
    when nothing listens)."""
    caller.require_scope("ports")
    await database_sync_to_async(billing_authorize)(caller, "ports")
    if sandbox.state != SandboxState.RUNNING:
        raise ProviderError(f"Sandbox {sandbox.id} is {sandbox.state}, not running.")
    provider = provider_for(sandbox)
    stream = await sync_to_async(provider.connect_port, thread_sensitive=False)(
        sandbox.provider_id, port
    )
    if operation is not None:
        # Awaited, not fire-and-forget: a request is counted before its answer leaves.
        await database_sync_to_async(billing_record)(caller, operation)
    return stream


def sandbox_port_websocket_opened(*, caller: Caller) -> None:
    """Count one preview WebSocket, once the server in the sandbox accepted it."""
    billing_record(caller, "ports.websocket")
