"""How many idle sandboxes a warm pool keeps: its floor, raised by the bursts it saw.

A create that finds the pool empty goes cold and counts as a miss. The target is the
floor (`size`) plus the misses of the last `BURST_WINDOW_S`, at most `max_size`, so after a
burst of 50 creates the pool refills, in the background, towards 50 and the next burst of
that size finds its sandboxes warm. With no miss for `DECAY_S` the target falls back to the
floor and the pool destroys its surplus. A steady stream of creates that the refills keep
up with never misses, so it does not grow the pool.

Used by both warm pools (local jails, docker containers), each under its own lock: this
class is not thread-safe by itself.
"""

from __future__ import annotations

import time
from collections import deque

BURST_WINDOW_S = 30.0
"""Misses (creates that found the pool empty) this recent raise the pool's target."""
DECAY_S = 600.0
"""With no miss for this long the target returns to the pool's floor."""


class BurstSizing:
    """The target of a pool whose floor is `size` and ceiling `max_size` (never below
    `size`)."""

    def __init__(self, size: int, max_size: int | None = None) -> None:
        self.size = size
        self.max_size = max(size, max_size or 0)
        self._target = size
        self._misses: deque[float] = deque()
        self._missed_at = 0.0

    def miss(self, now: float | None = None) -> None:
        """A create found the pool empty."""
        now = time.monotonic() if now is None else now
        misses = self._misses
        misses.append(now)
        while misses and now - misses[0] > BURST_WINDOW_S:
            misses.popleft()
        self._target = max(self._target, min(self.max_size, self.size + len(misses)))
        self._missed_at = now

    def target(self, now: float | None = None) -> int:
        """How many idle ones the pool should hold now."""
        now = time.monotonic() if now is None else now
        if self._target > self.size and now - self._missed_at > DECAY_S:
            self._target = self.size
            self._misses.clear()
        return self._target

    def grown(self) -> bool:
        """Whether the target is above the floor (a refill thread then wakes up by
        `DECAY_S` to shrink the pool back)."""
        return self._target > self.size
