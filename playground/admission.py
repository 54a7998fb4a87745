"""Creates, a few at a time and in order of arrival, per web process.

Each request runs on a thread of its own (playground/webthreads.py), and a burst of 100
creates arrives at once: all 100 ran side by side, each getting a hundredth of the
process's Python, so all of them finished near the end of the burst, and the commands
that follow each create queued behind the creates still in progress. Admitted a few at a
time, in order, the early ones finish early, and their follow-up requests (which are not
held here) run beside the next creates: half of a burst is done in about half its time.

A create that keeps its place longer than ``HOLD_LIMIT_S`` is waiting on something else
(a template's own jail, a snapshot restore, the docker engine), not using this process:
its place goes to the next in line while it goes on, so slow creates never hold up fast
ones for longer than that.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

HOLD_LIMIT_S = 1.0

CREATE_PATHS = frozenset({"/api/v1/sandboxes", "/e2b/sandboxes", "/e2b/v2/sandboxes"})
"""Sandpit's create and the E2B-compatible API's (sandboxes/urls.py, e2bcompat/urls.py)."""


class FairGate:
    """At most `places` holders at once, admitted first come, first served (asyncio's
    Semaphore lets a newcomer overtake a woken waiter). A place is given up by `leave`, or
    by the holder staying longer than `hold_limit_s`, whichever comes first."""

    def __init__(self, places: int, hold_limit_s: float = HOLD_LIMIT_S) -> None:
        if places < 1:
            raise ValueError("a gate needs at least one place")
        self.places = places
        self.hold_limit_s = hold_limit_s
        self.taken = 0
        self._waiting: deque[asyncio.Future[None]] = deque()

    async def enter(self) -> asyncio.TimerHandle:
        """Wait for a place; returns the handle to give to `leave`."""
        if self.taken < self.places and not self._waiting:
            self.taken += 1
        else:
            waiter = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)
            try:
                await waiter  # the place is counted for us by whoever woke us
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._free()  # woken, then cancelled before it could run: pass it on
                elif waiter in self._waiting:  # not yet passed over by _free
                    self._waiting.remove(waiter)
                raise
        return asyncio.get_running_loop().call_later(self.hold_limit_s, self._free)

    def leave(self, held: asyncio.TimerHandle) -> None:
        """Give the place back, unless the hold limit already did."""
        if not held.cancelled() and held.when() > asyncio.get_running_loop().time():
            held.cancel()
            self._free()

    def _free(self) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the place passes on, still counted
                return
        self.taken -= 1


class CreateAdmission:
    """ASGI middleware: sandbox creates pass `gate` in order of arrival; all else straight
    through. One gate per web process (each has its own event loop and Python)."""

    def __init__(self, app: Any, places: int) -> None:
        self.app = app
        self.places = places
        self.gate: FairGate | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if (
            self.places < 1
            or scope["type"] != "http"
            or scope["method"] != "POST"
            or scope["path"] not in CREATE_PATHS
        ):
            await self.app(scope, receive, send)
            return
        if self.gate is None:
            self.gate = FairGate(self.places)
        held = await self.gate.enter()
        try:
            await self.app(scope, receive, send)
        finally:
            self.gate.leave(held)
