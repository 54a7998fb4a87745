"""Services of the live operations: streamed runs, file watchers, event subscriptions and
port connections (the exec and events sockets and the preview proxy call these).

Same door as every other sandbox operation (sandboxes.caller): scope, billing authorization,
the provider call, one usage record. What differs is timing: a streamed run or a preview is
counted when it starts, a watcher once it watches, a preview WebSocket once the server in
the sandbox accepted it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async

from playground.errors import ApplicationError

from .activity import sandbox_touch_id
from .caller import Caller, billing_allows, billing_authorize, billing_record, metered
from .models import Sandbox, SandboxState
from .programs import exec_runner
from .providers.base import Capability, InvalidRequest, PortStream, ProviderError, PtySession
from .services import provider_for, require_capability, resolve_language
from .watchers import FileWatcher, WatchSpec, sandbox_pollers

__all__ = [  # the provider types a streaming interface handles, re-exported
    "InvalidRequest",
    "PortStream",
    "ProviderError",
    "PtySession",
]

EXEC_RUNNER_SOURCE = Path(exec_runner.__file__).read_text()
"""The runner program, handed to the sandbox's python3 in an environment variable."""
EXEC_LAUNCH = b'exec python3 -I -S -c "$SANDPIT_RUNNER"\n'
READY_MARK = exec_runner.READY_MARK
LANGUAGE_ARGV = {
    "python": ["python3", "-u", "-c"],
    "node": ["node", "-e"],
    "bash": ["bash", "-c"],
}


# --- streamed runs (the exec socket) -----------------------------------------------------------


def exec_stream_argv(
    *,
    command: object = None,
    args: Sequence[object] | None = None,
    code: object = None,
    language: str | None = None,
) -> tuple[list[str], str]:
    """The argv of a streamed run and its usage operation ('exec.code' or 'exec.command').
    `code` wins over `command`; `args is None` → `sh -c command`. ApplicationError
    'unknown_language' or 'invalid_message' (400)."""
    if code is not None:
        text = str(code)
        resolved = resolve_language(text, language)
        return [*LANGUAGE_ARGV[resolved], text], "exec.code"
    if not isinstance(command, str) or not command:
        raise ApplicationError("run needs 'command' or 'code'.", code="invalid_message")
    if args is None:
        return ["sh", "-c", command], "exec.command"
    return [command, *[str(a) for a in args]], "exec.command"


def sandbox_exec_stream_open(
    *,
    caller: Caller,
    sandbox: Sandbox,
    argv: Sequence[str],
    operation: str,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
) -> PtySession:
    """Start one streamed run: the runner (sandboxes/programs/exec_runner.py) on a PTY in the
    sandbox, already launched; its frames follow READY_MARK. Counted once as `operation`.
    Raises PaymentRequired (402), ApplicationError 'sandbox_not_running',
    CapabilityNotSupported and the provider's errors. Synchronous: call from a thread."""
    spec = {"argv": list(argv), "cwd": cwd, "env": dict(env or {}), "timeout_s": timeout_s}
    with metered(caller, feature="exec", operation=operation, scope="exec"):
        if sandbox.state != SandboxState.RUNNING:
            raise ApplicationError("The sandbox is not running.", code="sandbox_not_running")
        provider = provider_for(sandbox)
        require_capability(provider, Capability.PTY)
        pty = provider.open_pty(  # noqa: S604 - a fixed shell, not user input
            sandbox.provider_id,
            cols=200,
            rows=50,
            shell="/bin/sh",
            env={"SANDPIT_RUNNER": EXEC_RUNNER_SOURCE, "SANDPIT_EXEC": json.dumps(spec)},
        )
        pty.write(EXEC_LAUNCH)
    sandbox_touch_id(sandbox.id)
    return pty


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
    ('watch.create') when it watches. `watcher_id` names it once it may start. A coroutine because the watcher lives on the loop; the
    billing steps run in threads. Raises PaymentRequired (402), ApplicationError
    'sandbox_not_running', CapabilityNotSupported and the provider's errors."""
    caller.require_scope("files")
    await database_sync_to_async(billing_authorize)(caller, "watch")
    if sandbox.state != SandboxState.RUNNING:
        raise ApplicationError("The sandbox is not running.", code="sandbox_not_running")
    provider = provider_for(sandbox)
    require_capability(provider, Capability.WATCH)
    watcher = FileWatcher(
        watcher_id=watcher_id(),
        provider=provider,
        provider_id=sandbox.provider_id,
        spec=spec,
        deliver=deliver,
    )
    await watcher.start()
    await database_sync_to_async(billing_record)(caller, "watch.create")
    return watcher


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
