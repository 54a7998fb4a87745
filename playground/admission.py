"""Creates, a few at a time and in order of arrival (per caller, in turn), per web process.

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

The line is one per caller (the credential a request presents), served in turn: one
caller's thousand creates do not queue ahead of another caller's one. A credential gets a
line of its own once one of its creates was answered as authenticated (anything but 401 or
403); until then it waits in one line shared by every unproven credential, so a flood of
forged keys, each different, takes one turn in each round, not one per forged key. The
rate limits and the concurrent-sandbox cap are checked later, in the view, once the key is
resolved.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict, deque
from typing import Any

HOLD_LIMIT_S = 1.0

CREATE_PATHS = frozenset({"/api/v1/sandboxes", "/e2b/sandboxes", "/e2b/v2/sandboxes"})
"""Sandpit's create and the E2B-compatible API's (sandboxes/urls.py, e2bcompat/urls.py)."""


class FairGate:
    """At most `places` holders at once. Waiters line up per caller (`enter(line)`), each
    line first come, first served, the lines served in turn; a newcomer never overtakes a
    woken waiter (asyncio's Semaphore lets it). A place is given up by `leave`, or by the
    holder staying longer than `hold_limit_s`, whichever comes first."""

    def __init__(self, places: int, hold_limit_s: float = HOLD_LIMIT_S) -> None:
        if places < 1:
            raise ValueError("a gate needs at least one place")
        self.places = places
        self.hold_limit_s = hold_limit_s
        self.taken = 0
        self._lines: dict[str, deque[asyncio.Future[None]]] = {}
        """Callers with someone waiting, in the order they are served (dicts keep it)."""

    async def enter(self, line: str = "") -> asyncio.TimerHandle:
        """Wait for a place in `line`; returns the handle to give to `leave`."""
        if self.taken < self.places and not self._lines:
            self.taken += 1
        else:
            waiter = asyncio.get_running_loop().create_future()
            self._lines.setdefault(line, deque()).append(waiter)
            try:
                await waiter  # the place is counted for us by whoever woke us
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._free()  # woken, then cancelled before it could run: pass it on
                else:
                    self._drop(line, waiter)
                raise
        return asyncio.get_running_loop().call_later(self.hold_limit_s, self._free)

    def leave(self, held: asyncio.TimerHandle) -> None:
        """Give the place back, unless the hold limit already did."""
        if not held.cancelled() and held.when() > asyncio.get_running_loop().time():
            held.cancel()
            self._free()

    def _drop(self, line: str, waiter: asyncio.Future[None]) -> None:
        waiting = self._lines.get(line)
        if waiting is not None and waiter in waiting:
            waiting.remove(waiter)
            if not waiting:
                del self._lines[line]

    def _free(self) -> None:
        while self._lines:
            line = next(iter(self._lines))
            waiting = self._lines.pop(line)
            waiter = waiting.popleft()
            if waiting:
                self._lines[line] = waiting  # to the back: the next caller's turn
            if not waiter.done():
                waiter.set_result(None)  # the place passes on, still counted
                return
        self.taken -= 1


CREDENTIAL_HEADERS = (b"authorization", b"x-api-key")
"""Sandpit's API (Bearer key) and the E2B-compatible API (X-API-Key)."""


UNPROVEN_LINE = "unproven"
"""The line of every credential not yet seen to authenticate in this process."""

NOT_AUTHENTICATED = frozenset({401, 403})
"""Answers that do not prove a credential (DRF refuses a session without one with 403)."""


def caller_credential(scope: dict[str, Any]) -> bytes:
    """The credential a request presents: an API key header, else the cookie header that
    carries a browser session; empty when it has neither."""
    cookie = b""
    for name, value in scope.get("headers") or ():
        name = name.lower()
        if name in CREDENTIAL_HEADERS:
            return bytes(value)
        if name == b"cookie":
            cookie = value
    return bytes(cookie)


class ProvenCallers:
    """Digests of the credentials whose creates were answered as authenticated, the most
    recent last, at most `limit` (memory stays bounded whatever callers send). Used from
    the event loop only. Only digests are kept: the gate never holds a secret."""

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._proven: OrderedDict[str, None] = OrderedDict()

    @staticmethod
    def digest(credential: bytes) -> str:
        return hashlib.sha256(credential).hexdigest()

    def line(self, digest: str) -> str:
        """The caller's own line once proven, else the shared unproven one."""
        return digest if digest in self._proven else UNPROVEN_LINE

    def answered(self, digest: str, status: int | None) -> None:
        if status is None or status in NOT_AUTHENTICATED:
            return
        self._proven[digest] = None
        self._proven.move_to_end(digest)
        while len(self._proven) > self.limit:
            self._proven.popitem(last=False)

    def __len__(self) -> int:
        return len(self._proven)


class CreateAdmission:
    """ASGI middleware: sandbox creates pass `gate` (per caller, in turn); all else straight
    through. One gate per web process (each has its own event loop and Python)."""

    def __init__(self, app: Any, places: int) -> None:
        self.app = app
        self.places = places
        self.gate: FairGate | None = None
        self.proven = ProvenCallers()

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
        digest = self.proven.digest(caller_credential(scope))
        held = await self.gate.enter(self.proven.line(digest))
        status: int | None = None

        async def send_noting_status(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        finally:
            self.gate.leave(held)
            self.proven.answered(digest, status)
