"""The services the E2B layer needed that Sandpit did not have.

Signals to a streamed run travel as a frame to its runner (the sandbox's pid namespace is
the runner's), so, like stdin to a streamed run (sandboxes.streaming.
sandbox_exec_stream_stdin), the door authorizes and counts and the caller then sends.
Typing into a PTY through `pty.send_stdin` is counted by the terminal rule, with its
window kept where every web process sees it; a polled watcher's read position is kept
there too.
"""

from __future__ import annotations

import signal
import time
import uuid

from django.core.cache import cache

from sandboxes.caller import Caller, billing_authorize, billing_record, metered
from sandboxes.models import Sandbox
from sandboxes.providers.base import FileEvent
from sandboxes.streaming import sandbox_session_send, sandbox_watch_poll
from sandboxes.terminals import METER_WINDOW_S, count_enters


def e2b_run_signal_authorize(*, caller: Caller, number: int) -> None:
    """Authorize and count one signal to a streamed run ('process.signal'). SIGKILL stops
    whatever runs and is never refused by billing, as sandbox_process_signal. Raises
    PaymentRequired (402) for other signals past the plan. Synchronous: call from a thread."""
    with metered(
        caller,
        feature="processes",
        operation="process.signal",
        scope="exec",
        teardown=number == signal.SIGKILL,
    ):
        pass


def e2b_pty_input(*, caller: Caller, sandbox: Sandbox, session_id: str, data: bytes) -> None:
    """Type `data` into an agent-held PTY, counted by the terminal rule
    (sandboxes.terminals.TerminalMeter): in each METER_WINDOW_S window of the terminal
    with input, max(1, Enters) 'terminal.line'. Each send_stdin is its own request, which
    any web process may serve, so the window's count of Enters lives in the cache (Redis
    whenever several processes serve); two sends racing at a window's start may count one
    extra. PaymentRequired (402) before anything is typed once input is not allowed;
    ProcessNotFound when the PTY is gone. Synchronous: call from a thread."""
    billing_authorize(caller, "terminal")
    sandbox_session_send(sandbox=sandbox, session_id=session_id, kind="stdin", payload=data)
    enters = count_enters(data)
    key = f"e2b:pty-window:{session_id}:{int(time.time() // METER_WINDOW_S)}"
    try:  # one round trip but for the window's first input
        after, first = cache.incr(key, enters), False
    except ValueError:  # the window's first input (unless another process just made it)
        first = cache.add(key, enters, timeout=int(METER_WINDOW_S * 2))
        after = enters if first else cache.incr(key, enters)
    before = after - enters
    due = max(1, after) - (0 if first else max(1, before))
    for _ in range(due):
        billing_record(caller, "terminal.line", f"e2b-pty:{uuid.uuid4().hex}")


WATCH_STATE_TTL_S = 3600
"""Longer than a polled watch outlives its last poll (sandboxes.streaming)."""


def _watch_key(session_id: str) -> str:
    return f"e2b:polled-watch:{session_id}"


def e2b_watch_remember(*, session_id: str, path: str, offset: int) -> None:
    """What the next GetWatcherEvents of a polled watcher needs: the directory it watches
    (events are named relative to it) and where to read from."""
    cache.set(_watch_key(session_id), {"path": path, "offset": offset}, WATCH_STATE_TTL_S)


def e2b_watch_events(
    *, caller: Caller, sandbox: Sandbox, session_id: str
) -> tuple[list[FileEvent], str]:
    """The events of an agent-held polled watcher since its last poll, and the directory
    it watches, through whichever web process (the read position lives in the cache:
    Redis whenever several processes serve). Two polls racing may both return the same
    events. Not counted. NotFound 'watcher_not_found'. Synchronous: call from a thread."""
    state = cache.get(_watch_key(session_id)) or {}
    path = str(state.get("path") or ".")
    events, offset = sandbox_watch_poll(
        caller=caller, sandbox=sandbox, session_id=session_id, since=int(state.get("offset") or 0)
    )
    e2b_watch_remember(session_id=session_id, path=path, offset=offset)
    return events, path
