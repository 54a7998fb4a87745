"""A pool of pre-started, idle jails that `LocalProvider.create` claims instead of
starting one (~1 ms instead of ~25 ms).

A warm jail is an ordinary jail started with default resources, no sandbox
environment and a pool name, ``warm-<owner pid>-<owner start ticks>-<random>``.
Claiming it (LocalProvider._adopt) rewrites its cgroup limits, resizes its
tmpfs, writes the sandbox's environment and rlimits on a pipe only this
process holds (the agent applies them before its first request: see
``await_config`` in sandboxes/agent/server.py), renames its directory to the sandbox id and
rewrites state.json. Afterwards nothing tells it from a jail started cold.

Ownership: each process has its own pool and records itself, in the directory
name and in state.json, as the owner of its unclaimed jails. `list()` hides
those while the owner runs (the reconciler would destroy them as orphans) and
shows them once it has died, so the reconciler cleans up after a crash.
`close()` (also run at exit) destroys the unclaimed ones. After fork() the
child starts with an empty pool of its own: the parent's jails stay the parent's.

`workers` daemon threads per pool refill it (default: one per core, at most `size`), each
one jail at a time, after a quiet moment (`REFILL_QUIET_S`) unless the pool is below half
its target, and not while creates arrive together (`BURST_HOLD_S`). The workers run at the
lowest CPU priority where they may come back for the moment a jail starts
(`BACKGROUND_NICE`), and warm jails start in a background cgroup (idle CPU priority), so a
refill takes the cores only when the creates leave them idle; one worker alone took about 10 s to refill 100 jails here, so a second
burst would have started cold.

Bursts: `size` is the pool's floor; after a burst of creates that found it empty the pool
refills, in the background and at idle priority, towards the burst's size, at most
`max_size`, and shrinks back after a quiet spell (sandboxes/providers/burst_sizing.py). A
jail started cold costs the same CPU as a warm one, but in the burst, on its critical path;
a warm one is started while the host is otherwise idle (an idle jail holds ~4 MiB).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

from sandboxes.providers import burst_sizing
from sandboxes.providers.base import SandboxGone
from sandboxes.providers.burst_sizing import BurstSizing
from sandboxes.providers.local import jail

logger = logging.getLogger(__name__)
T = TypeVar("T")

PREFIX = "warm-"
_CLOSE_WAIT_S = 10.0
_MAX_BACKOFF_S = 30.0
REFILL_QUIET_S = 0.1
"""After a claim, a refill waits this long while at least half the target remains idle, so a
new sandbox's first commands do not compete with starting its replacement in this process (its
thread, its cgroup and mount work): about 2 ms of the first API command here. Below half it
starts at once: a steady stream of creates (one every 25 ms, say) is never quiet for that
long, and waiting drained the pool, after which every create went cold (one after another,
the default pool of 8: p95 44-54 ms instead of 24-26)."""
BACKGROUND_NICE = 19
"""The refill workers' CPU priority in the web process (nice), where they may come back to
their own for the moment a jail's first process starts (`WarmPool.process_start`). Their
Python (~2.4 ms of CPU per jail: its command line, cgroups, volume, state) ran beside the
requests at the same priority. One after another on the default pool (bench_burst.py, two
web processes, the commit before alternated in the same runs): 1.43-1.77x a raw spawn
(mean 1.64x) against 1.50-1.88x (1.75x), better in six runs of seven. The jail itself starts
in a background cgroup (idle CPU priority) as before."""
BURST_HOLD_S = 0.1
"""Once two creates were in progress at once in this process (a burst: one after another,
there is never more than one), the refill waits until this long after the last such moment.
A refill costs the web process ~3 ms of its Python (the jail's command line, cgroups, volume,
Popen) beside the jail's own start-up. In bursts of 100 on a pool the previous burst had grown
(bench_burst.py, two web processes, seven runs alternated with refills as the pool emptied):
15.9 instead of 18.5 CPU-ms per sandbox (web 10.5 vs 11.4, jails 5.3 vs 7.1), the median 1.80×
its raw floor instead of 2.42× on average. The creates the pool no longer covers meanwhile
start their own jail, as they did when the refill ran beside them."""


def pool_name(owner_pid: int, owner_ticks: int) -> str:
    """A fresh directory name for a warm jail owned by `owner_pid`."""
    return f"{PREFIX}{owner_pid}-{owner_ticks}-{uuid.uuid4().hex[:16]}"


def owner_alive(name: str) -> bool:
    """Whether `name` is a warm jail's directory name and its owning process still runs."""
    if not name.startswith(PREFIX):
        return False
    try:
        pid_s, ticks_s, _ = name[len(PREFIX) :].split("-", 2)
        pid, ticks = int(pid_s), int(ticks_s)
    except ValueError:
        return False
    return pid > 0 and jail.start_ticks(pid) == ticks


@dataclass
class WarmJail:
    """An unclaimed jail: its id and the write end of its configuration pipe."""

    jail_id: str
    config_fd: int

    def close_config(self) -> None:
        """Close the configuration pipe (idempotent); the agent then reads EOF."""
        if self.config_fd >= 0:
            fd, self.config_fd = self.config_fd, -1
            os.close(fd)


class WarmPool:
    """Up to `size` idle jails made by `spawn()`, thread-safe.

    `claim(adopt)` pops one and calls `adopt(warm)`; a jail is handed to one
    caller only. `destroy(jail_id)` removes a jail that will never be claimed.
    """

    def __init__(
        self,
        size: int,
        spawn: Callable[[], WarmJail],
        destroy: Callable[[str], object],
        workers: int | None = None,
        max_size: int | None = None,
    ) -> None:
        self.size = size
        self.max_size = max(size, max_size or 0)
        self.workers = max(1, min(size, workers or os.cpu_count() or 1))
        self._spawn = spawn
        self._destroy = destroy
        self._reset()
        ref = weakref.ref(self)
        atexit.register(_close_at_exit, ref)
        os.register_at_fork(after_in_child=lambda: _reset_after_fork(ref))
        # Filled lazily, from the first claim on: processes that never create sandboxes
        # (Celery workers reaping, management commands) keep no idle jails.

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._cond = threading.Condition(threading.Lock())
        self._idle: list[WarmJail] = []
        self._starting = 0
        self._closed = False
        self._failures = 0
        self._last_claim = 0.0
        self._creating = 0
        self._together_at = -BURST_HOLD_S
        """When two creates were last in progress at once (monotonic)."""
        self._threads: list[threading.Thread] = []
        self._sizing = BurstSizing(self.size, self.max_size)
        self._local = threading.local()

    def idle_count(self) -> int:
        """Unclaimed jails ready now."""
        with self._cond:
            return len(self._idle)

    def target(self) -> int:
        """How many idle jails the pool refills to now (`size`, more after a burst)."""
        with self._cond:
            return self._sizing.target()

    def start(self) -> None:
        """Start filling now, before the first claim (a web process about to serve)."""
        self._wake()

    def wait_full(self, timeout_s: float) -> bool:
        """Block until the pool holds its target of idle jails; False after `timeout_s`."""
        with self._cond:
            self._wake_locked()
            return self._cond.wait_for(lambda: len(self._idle) >= self._sizing.target(), timeout_s)

    @contextmanager
    def creating(self) -> Iterator[None]:
        """Around each create of the provider (claimed or cold), so that the refill knows
        when creates arrive together (BURST_HOLD_S)."""
        with self._cond:
            self._creating += 1
            if self._creating > 1:
                self._together_at = time.monotonic()
        try:
            yield
        finally:
            with self._cond:
                self._creating -= 1
                if self._creating > 0:
                    self._together_at = time.monotonic()
                self._cond.notify_all()

    def take(self) -> WarmJail | None:
        """An idle jail set aside, unchanged, for one caller to `claim` or `give_back`;
        None when the pool is empty (nothing is recorded: the claim that follows does it)."""
        with self._cond:
            if self._closed or not self._idle:
                return None
            self._last_claim = time.monotonic()
            return self._idle.pop(0)

    def give_back(self, warm: WarmJail) -> None:
        """A jail `take` set aside and nothing changed: idle again, first in line."""
        with self._cond:
            kept = not self._closed and self._pid == os.getpid()
            if kept:
                self._idle.insert(0, warm)
                self._cond.notify_all()
        if not kept:
            self._destroy_quietly(warm)

    def claim(self, adopt: Callable[[WarmJail], T], taken: WarmJail | None = None) -> T | None:
        """`adopt(warm)` on an idle jail (`taken`, when one was set aside for it); None
        when the pool is empty or adopting failed (the jail is destroyed then and the
        caller should start one cold). SandboxGone from `adopt` (the sandbox was destroyed
        while it was being created) is raised, once the jail is destroyed: nothing to start."""
        with self._cond:
            if taken is not None:
                warm = taken
            elif self._closed or not self._idle:
                if not self._closed and self._threads:  # not the first create: it fills it
                    self._sizing.miss()
                self._wake_locked()
                return None
            else:
                warm = self._idle.pop(0)
                self._last_claim = time.monotonic()
        try:
            return adopt(warm)
        except SandboxGone:
            self._destroy_quietly(warm)
            raise
        except Exception:  # noqa: BLE001 - any failure means "start it cold instead"
            logger.warning("could not claim warm jail %s", warm.jail_id, exc_info=True)
            self._destroy_quietly(warm)
            return None
        finally:
            # Refill only now: starting a jail meanwhile would slow this claim down.
            self._wake()

    def close(self) -> None:
        """Stop refilling and destroy every unclaimed jail. Idempotent."""
        with self._cond:
            if self._pid != os.getpid():  # a forked child's copy owns nothing
                return
            self._closed = True
            idle, self._idle = self._idle, []
            threads = list(self._threads)
            self._cond.notify_all()
        deadline = time.monotonic() + _CLOSE_WAIT_S
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
        for warm in idle:
            self._destroy_quietly(warm)

    # ------------------------------------------------------------------ target

    def _out_of_step_locked(self) -> bool:
        """Whether a refill worker has work: jails to start, or a surplus to destroy."""
        target = self._sizing.target()
        idle = len(self._idle)
        return idle + self._starting < target or idle > target

    # ------------------------------------------------------------------ refill

    def _wake(self) -> None:
        with self._cond:
            self._wake_locked()

    def _wake_locked(self) -> None:
        if self._closed or self.size <= 0:
            return
        if not self._threads:
            for index in range(self.workers):
                thread = threading.Thread(
                    target=self._run, name=f"sandpit-local-warm-pool-{index}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
        self._cond.notify_all()

    @contextmanager
    def process_start(self) -> Iterator[None]:
        """Around starting a warm jail's first process: on a refill worker, at the priority
        the worker had before it went to BACKGROUND_NICE (the jail's processes inherit the
        nice value of the thread that starts them, and no sandbox may run at the refill's)."""
        base: int | None = getattr(self._local, "base_nice", None)
        if base is None:
            yield
            return
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, base)
        try:
            yield
        finally:
            os.setpriority(os.PRIO_PROCESS, tid, BACKGROUND_NICE)

    def _to_background(self) -> None:
        """This refill worker to BACKGROUND_NICE, where it may come back (see process_start);
        where it may not (no CAP_SYS_NICE nor RLIMIT_NICE), it stays where it is."""
        tid = threading.get_native_id()
        base = os.getpriority(os.PRIO_PROCESS, tid)
        if base < BACKGROUND_NICE and _may_come_back(base):
            os.setpriority(os.PRIO_PROCESS, tid, BACKGROUND_NICE)
            self._local.base_nice = base

    def _run(self) -> None:
        self._to_background()
        while True:
            surplus = None
            with self._cond:
                self._cond.wait_for(
                    lambda: self._closed or self._out_of_step_locked(),
                    timeout=burst_sizing.DECAY_S if self._sizing.grown() else None,
                )
                if self._closed:
                    return
                target = self._sizing.target()
                if len(self._idle) > target:  # a burst's surplus, once it decayed
                    surplus = self._idle.pop()
                elif len(self._idle) + self._starting >= target:
                    continue
                else:
                    now = time.monotonic()
                    quiet_for = now - self._last_claim
                    if len(self._idle) * 2 >= target and quiet_for < REFILL_QUIET_S:
                        self._cond.wait(REFILL_QUIET_S - quiet_for)
                        continue
                    burst_for = BURST_HOLD_S - (now - self._together_at)
                    if self._creating > 1 or burst_for > 0:
                        self._cond.wait(burst_for if burst_for > 0 else BURST_HOLD_S)
                        continue
                    self._starting += 1
            if surplus is not None:
                self._destroy_quietly(surplus)
                continue
            warm = None
            try:
                warm = self._spawn()
            except Exception:  # noqa: BLE001 - keep the thread; creates fall back to cold
                logger.warning("could not start a warm jail", exc_info=True)
            with self._cond:
                self._starting -= 1
                closed = self._closed
                if warm is not None and not closed:
                    self._idle.append(warm)
                    self._failures = 0
                    self._cond.notify_all()
                elif warm is None:
                    self._failures += 1
                failures = self._failures
            if warm is not None and closed:
                self._destroy_quietly(warm)
            if failures:  # back off so a broken host does not spin a core
                time.sleep(min(_MAX_BACKOFF_S, 0.1 * 2**failures))

    def _destroy_quietly(self, warm: WarmJail) -> None:
        try:
            warm.close_config()
            self._destroy(warm.jail_id)
        except Exception:  # noqa: BLE001 - best effort; the reconciler is the backstop
            logger.warning("could not destroy warm jail %s", warm.jail_id, exc_info=True)


def _may_come_back(base: int) -> bool:
    """Whether a thread of this process at nice `base` may go to BACKGROUND_NICE and come
    back: tried on a thread of its own, which then ends with whatever it was left at."""
    came_back: list[bool] = []

    def probe() -> None:
        tid = threading.get_native_id()
        try:
            os.setpriority(os.PRIO_PROCESS, tid, BACKGROUND_NICE)
            os.setpriority(os.PRIO_PROCESS, tid, base)
        except OSError:
            came_back.append(False)
        else:
            came_back.append(os.getpriority(os.PRIO_PROCESS, tid) == base)

    thread = threading.Thread(target=probe, name="sandpit-local-warm-pool-probe")
    thread.start()
    thread.join()
    return came_back == [True]


def _close_at_exit(ref: weakref.ref[WarmPool]) -> None:
    pool = ref()
    if pool is not None:
        pool.close()


def _reset_after_fork(ref: weakref.ref[WarmPool]) -> None:
    pool = ref()
    if pool is not None:
        for warm in pool._idle:  # the parent's: holding them would delay their EOF
            warm.close_config()
        pool._reset()
