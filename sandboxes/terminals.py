"""Terminal services: create, attach, type into, resize and kill a sandbox's terminals.

With a provider that runs the agent (local, docker) the terminal lives in the sandbox: the
agent owns the PTY, the shell and the scrollback (sandboxes/agent/sessions.py), so every
web process can list, attach to, resize and kill it, and it survives the web process that
created it; a socket relays through sandboxes/terminal_relay.py. Other providers' terminals
(cloud) stay in this process's registry (sandboxes/terminal_registry.py). Every operation
here goes through the one door (sandboxes.caller.metered) like any other sandbox
operation; typing is the exception in shape, not in rule: keystrokes never wait for the
database, so a TerminalSession counts them as they pass and `flush` records them (from a
thread) about once a second.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

from django.conf import settings

from common.errors import Conflict, NotFound, QuotaExceeded

from .activity import sandbox_touch_id
from .agent_sessions import (
    AgentSessions,
    SessionInfo,
    sandbox_cwd,
    session_attach,
    session_get,
    session_kill,
    session_list,
    session_open,
    session_resize,
    supports_sessions,
)
from .caller import Caller, billing_authorize, billing_record, metered
from .models import Sandbox, SandboxState
from .provider_access import provider_for, require_capability
from .providers.base import Capability, ProcessNotFound, ProviderError, SandboxProvider
from .terminal_registry import (
    Terminal,
    TerminalClient,
    TerminalInfo,
    clamp_size,
    terminal_manager,
    terminals_close_for_sandbox,
)
from .terminal_relay import AgentTerminal

__all__ = [
    "METER_WINDOW_S",
    "AgentTerminal",
    "Terminal",
    "TerminalClient",
    "TerminalInfo",
    "TerminalSession",
    "clamp_size",
    "count_enters",
    "terminal_attach",
    "terminal_create",
    "terminal_get",
    "terminal_kill",
    "terminal_manager",
    "terminal_resize",
    "terminals_close_for_sandbox",
    "terminals_for_sandbox",
]

METER_WINDOW_S = 60.0
"""Terminal input is counted at least once per started window (of a socket) with any input:
keystrokes that run commands without an Enter (Ctrl-O, a `read -d ';'` loop, a program in
raw mode) cannot make a terminal free."""
meter_clock = time.monotonic
"""The clock of those windows (a module attribute, so tests can drive it)."""


def max_terminals_per_sandbox() -> int:
    return int(getattr(settings, "SANDPIT_MAX_TERMINALS_PER_SANDBOX", 20))


def _agent(sandbox: Sandbox) -> AgentSessions | None:
    """The sandbox's provider when its terminals live in the agent; None otherwise."""
    if not sandbox.provider_id:
        return None
    try:
        provider: SandboxProvider = provider_for(sandbox)
    except ProviderError:
        return None
    return provider if supports_sessions(provider) else None


def _info(sandbox_id: str, session: SessionInfo) -> TerminalInfo:
    shell = session.meta.get("shell")
    return TerminalInfo(
        id=session.id,
        sandbox_id=str(sandbox_id),
        cols=session.cols,
        rows=session.rows,
        shell=shell if isinstance(shell, str) else None,
        created_at=session.created_at,
        clients=session.clients,
        running=session.running,
        exit_code=session.exit_code,
    )


def terminal_create(
    *,
    caller: Caller,
    sandbox: Sandbox,
    cols: int = 80,
    rows: int = 24,
    shell: str | None = None,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    meta: Mapping[str, Any] | None = None,
) -> TerminalInfo:
    """Open a shell on a PTY in the sandbox (counted once, feature 'terminal'): held by the
    sandbox's agent where the provider runs one (listed with `meta`, a small JSON object),
    else registered in this process.

    Raises Conflict (409) when the sandbox is not running, QuotaExceeded (429) past
    SANDPIT_MAX_TERMINALS_PER_SANDBOX live terminals, CapabilityNotSupported (501),
    PaymentRequired (402), and the provider's errors."""
    with metered(caller, feature="terminal", operation="terminal.create", scope="terminal"):
        if sandbox.state != SandboxState.RUNNING:
            raise Conflict(
                f"Sandbox {sandbox.id} is {sandbox.state}, not running.",
                code="sandbox_not_running",
            )
        provider = provider_for(sandbox)
        require_capability(provider, Capability.PTY)
        cols, rows = clamp_size(cols, rows)
        agent: AgentSessions | None = provider if supports_sessions(provider) else None
        if agent is not None:
            live = len([s for s in session_list(agent, sandbox.provider_id, "pty") if s.running])
        else:
            live = len([t for t in terminal_manager.for_sandbox(sandbox.id) if not t.ended])
        limit = max_terminals_per_sandbox()
        if live >= limit:
            raise QuotaExceeded(
                f"This sandbox already has {live} terminals (limit {limit}).",
                code="terminal_limit_reached",
            )
        if agent is not None:
            session, _ = session_open(
                agent,
                sandbox.provider_id,
                kind="pty",
                argv=[shell or "/bin/bash"],
                cwd=sandbox_cwd(cwd),
                env=env,
                cols=cols,
                rows=rows,
                meta={**(meta or {}), "shell": shell},
            )
            info = _info(sandbox.id, session)
        else:
            pty = provider.open_pty(
                sandbox.provider_id, cols=cols, rows=rows, shell=shell or None, cwd=cwd, env=env
            )
            terminal = Terminal(
                manager=terminal_manager,
                sandbox_id=sandbox.id,
                organization_id=sandbox.organization_id,
                pty=pty,
                cols=cols,
                rows=rows,
                shell=shell,
            )
            terminal_manager.add(terminal)
            info = terminal.info()
    sandbox_touch_id(sandbox.id)
    return info


def terminals_for_sandbox(*, sandbox: Sandbox) -> list[TerminalInfo]:
    """The sandbox's terminals, oldest first, ended ones for a while too (not counted). A
    sandbox whose agent does not answer (stopped) has none."""
    found = [t.info() for t in terminal_manager.for_sandbox(sandbox.id)]
    agent = _agent(sandbox)
    if agent is not None and sandbox.state == SandboxState.RUNNING:
        try:
            sessions = session_list(agent, sandbox.provider_id, "pty")
        except ProviderError:
            sessions = []
        found += [_info(sandbox.id, s) for s in sessions]
    return sorted(found, key=lambda t: t.created_at)


def _not_found() -> NotFound:
    return NotFound("No such terminal in this sandbox.", code="terminal_not_found")


def terminal_get(*, sandbox: Sandbox, terminal_id: str) -> TerminalInfo:
    """A terminal of this sandbox (any web process's); NotFound otherwise."""
    terminal = terminal_manager.get(sandbox.id, terminal_id)
    if terminal is not None:
        return terminal.info()
    agent = _agent(sandbox)
    if agent is None or not terminal_id.startswith("term_"):
        raise _not_found()
    try:
        return _info(sandbox.id, session_get(agent, sandbox.provider_id, terminal_id))
    except ProviderError:
        raise _not_found() from None


def terminal_kill(*, caller: Caller, sandbox: Sandbox, terminal_id: str) -> None:
    """Kill the shell and its process tree; attached sockets (of every process) get
    {"type": "exit"}. Never refused by billing (stopping), counted only while billing
    would allow it."""
    terminal_get(sandbox=sandbox, terminal_id=terminal_id)
    terminal = terminal_manager.get(sandbox.id, terminal_id)
    with metered(
        caller, feature="terminal", operation="terminal.kill", scope="terminal", teardown=True
    ):
        if terminal is not None:
            terminal_manager.remove(terminal)
            return
        agent = _agent(sandbox)
        if agent is None:
            raise _not_found()
        try:
            session_kill(agent, sandbox.provider_id, terminal_id)
        except ProcessNotFound:
            raise _not_found() from None


def terminal_resize(
    *, caller: Caller, sandbox: Sandbox, terminal_id: str, cols: int, rows: int
) -> TerminalInfo:
    """Resize a terminal's PTY (counted once). Conflict 'terminal_ended' once it ended."""
    info = terminal_get(sandbox=sandbox, terminal_id=terminal_id)
    terminal = terminal_manager.get(sandbox.id, terminal_id)
    with metered(caller, feature="terminal", operation="terminal.resize", scope="terminal"):
        if not info.running:
            raise Conflict("The terminal has ended.", code="terminal_ended")
        cols, rows = clamp_size(cols, rows)
        if terminal is not None:
            terminal.pty.resize(cols, rows)
            terminal.cols, terminal.rows = cols, rows
            return terminal.info()
        agent = _agent(sandbox)
        if agent is None:
            raise _not_found()
        try:
            session = session_resize(agent, sandbox.provider_id, terminal_id, cols, rows)
        except ProcessNotFound:
            raise Conflict("The terminal has ended.", code="terminal_ended") from None
        return _info(sandbox.id, session)


# --- typing into a terminal over a WebSocket -------------------------------------------------


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


class TerminalSession:
    """One socket typing into one terminal, on the caller's account.

    `write` is the keystroke path: it runs on the event loop, writes the PTY and counts what
    the input makes due, without touching the database. `flush` records the due executions
    (each under its own event id, so a retried flush never counts one twice) and then checks
    that the next input is still allowed; it is synchronous, for a thread."""

    def __init__(self, caller: Caller, terminal: Terminal | AgentTerminal) -> None:
        self.caller = caller
        self.terminal = terminal
        self._meter = TerminalMeter()
        self._meter_id = uuid.uuid4().hex
        self._due = 0
        self._seq = 0

    @property
    def pending(self) -> int:
        """Executions typed but not recorded yet."""
        return self._due

    def write(self, data: bytes) -> None:
        self.terminal.write(data)
        self._due += self._meter.input(data)

    def take(self) -> tuple[int, int]:
        """Claim the due executions for one flush, on the loop: (first sequence, count)."""
        count, self._due = self._due, 0
        first = self._seq
        self._seq += count
        return first, count

    def flush(self, first: int, count: int, *, authorize: bool = True) -> None:
        """Record `count` executions from sequence `first` (from `take`), then raise
        PaymentRequired if typing more is no longer allowed (unless `authorize` is False:
        the socket is closing)."""
        for seq in range(first, first + count):
            billing_record(self.caller, "terminal.line", f"term:{self._meter_id}:{seq}")
        if authorize:
            billing_authorize(self.caller, "terminal")


def terminal_attach(
    *, caller: Caller, sandbox: Sandbox, terminal_id: str
) -> TerminalSession | None:
    """A session typing into the terminal for `caller` (attaching is not counted); None
    when the sandbox has no such terminal. For an agent-held terminal this connects to the
    agent: blocking, call from a thread; the relay then runs on the loop."""
    terminal = terminal_manager.get(sandbox.id, terminal_id)
    if terminal is not None:
        return TerminalSession(caller, terminal)
    agent = _agent(sandbox)
    if agent is None or sandbox.state != SandboxState.RUNNING:
        return None
    if not terminal_id.startswith("term_"):
        return None
    try:
        link = session_attach(agent, sandbox.provider_id, terminal_id)
    except ProviderError:
        return None
    if link.info.kind != "pty":
        link.close()
        return None
    return TerminalSession(caller, AgentTerminal(sandbox.id, link))
