"""Creates, a few at a time and in order of arrival (per caller, in turn), per web process.

Each request runs on a thread of its own (playground/webthreads.py), and a burst of 100
creates arrives at once: all 100 ran side by side, each getting a hundredth of the
process's Python, so all of them finished near the end of the burst, and the commands
that follow each create queued behind the creates still in progress. Admitted a few at a
time, in order, the early ones finish early: half of a burst is done in about half its time.

A request on a sandbox already made (the command that follows a create) takes a place too,
at once and ahead of every waiting create, for at most ``FOLLOW_UP_HOLD_S``: work nearly
done finishes before more starts. Let through beside the next creates instead, a burst's
first commands took two to three times as long (their threads and their jails shared the
cores with those creates). At most all places but one are taken so: creates always move.
Only a proven caller's requests (below) take one, so requests under forged keys, answered
401 at once anyway, cannot take places from creates.

A create that keeps its place longer than ``HOLD_LIMIT_S`` is waiting on something else
(a template's own jail, a snapshot restore, the docker engine), not using this process:
its place goes to the next in line while it goes on, so slow creates never hold up fast
ones for longer than that.

The line is one per caller (the credential a request presents), served in turn: one
caller's thousand creates do not queue ahead of another caller's one. A credential gets a
line of its own once one of its requests here (a create, or one on a sandbox) was answered
as authenticated (anything but 401 or 403); until then it waits in one line shared by every
unproven credential, so a flood of forged keys, each different, takes one turn in each
round, not one per forged key. The rate limits and the concurrent-sandbox cap are checked
later, in the view, once the key is resolved.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict, deque
from typing import Any

HOLD_LIMIT_S = 1.0
FOLLOW_UP_HOLD_S = 0.2
"""The longest a request on an existing sandbox keeps a create waiting: a burst's first
command (`node -v`) took 50-130 ms; a longer one is waiting on its program, not this process."""

CREATE_PATHS = frozenset({"/api/v1/sandboxes", "/e2b/sandboxes", "/e2b/v2/sandboxes"})
"""Sandpit's create and the E2B-compatible API's (sandboxes/urls.py, e2bcompat/urls.py)."""

FOLLOW_UP_PREFIXES = tuple(sorted(f"{path}/" for path in CREATE_PATHS))
"""Requests on one sandbox: its commands, files, processes (below a create route)."""


class FairGate:
    """At most `places` holders at once. Waiters line up per caller (`enter(line)`), each
    line first come, first served, the lines served in turn; a newcomer never overtakes a
    woken waiter (asyncio's Semaphore lets it). A place is given up by `leave`, or by the
    holder staying longer than `hold_limit_s`, whichever comes first. `enter_ahead` takes
    a place at once, ahead of every waiter, even when all are taken."""

    def __init__(self, places: int, hold_limit_s: float = HOLD_LIMIT_S) -> None:
        if places < 1:
            raise ValueError("a gate needs at least one place")
        self.places = places
        self.hold_limit_s = hold_limit_s
        self.taken = 0
        self.ahead = 0
        """Places taken by enter_ahead (counted in `taken` too)."""
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

    def enter_ahead(self, hold_s: float) -> asyncio.TimerHandle | None:
        """Take a place now, without waiting, for at most `hold_s`; None when `places - 1`
        are taken so already (the one left is for `enter`'s waiters: they always move).
        Give it back with `leave(held, ahead=True)`."""
        if self.ahead >= self.places - 1:
            return None
        self.ahead += 1
        self.taken += 1
        return asyncio.get_running_loop().call_later(hold_s, self._free, True)

    def leave(self, held: asyncio.TimerHandle | None, *, ahead: bool = False) -> None:
        """Give the place back, unless the hold limit already did."""
        if held is None:
            return
        if not held.cancelled() and held.when() > asyncio.get_running_loop().time():
            held.cancel()
            self._free(ahead)

    def _drop(self, line: str, waiter: asyncio.Future[None]) -> None:
        waiting = self._lines.get(line)
        if waiting is not None and waiter in waiting:
            waiting.remove(waiter)
            if not waiting:
                del self._lines[line]

    def _free(self, ahead: bool = False) -> None:
        if ahead:
            self.ahead -= 1
        if self.taken > self.places:  # taken ahead past the gate's places: none is free yet
            self.taken -= 1
            return
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
    """ASGI middleware: sandbox creates pass `gate` (per caller, in turn), a proven caller's
    requests on one sandbox take a place ahead of them, all else goes straight through. One
    gate per web process (each has its own event loop and Python)."""

    def __init__(self, app: Any, places: int) -> None:
        self.app = app
        self.places = places
        self.gate: FairGate | None = None
        self.proven = ProvenCallers()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if self.places < 1 or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        is_create = scope["method"] == "POST" and scope["path"] in CREATE_PATHS
        if not is_create and not scope["path"].startswith(FOLLOW_UP_PREFIXES):
            await self.app(scope, receive, send)
            return
        if self.gate is None:
            self.gate = FairGate(self.places)
        gate = self.gate
        digest = self.proven.digest(caller_credential(scope))
        held: asyncio.TimerHandle | None
        if is_create:
            held = await gate.enter(self.proven.line(digest))
        else:  # forged credentials must not take places from creates: proven callers only
            proven = self.proven.line(digest) != UNPROVEN_LINE
            held = gate.enter_ahead(FOLLOW_UP_HOLD_S) if proven else None
        status: int | None = None

        async def send_noting_status(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        finally:
            gate.leave(held, ahead=not is_create)
            self.proven.answered(digest, status)
