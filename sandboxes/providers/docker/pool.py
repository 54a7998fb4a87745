"""A warm pool: containers started ahead of time, which `DockerProvider.create` claims
instead of starting one (a rename and a file write instead of an Engine create + start).

Starting a container is the Engine's slow part (about 90 ms alone here, seconds each when
fifty start at once on two cores); a claimed one answers its first command at once.

* **What is pooled.** The common spec only: the provider's own image and runtime, default
  resources, no network, no environment, no snapshot to restore. Anything else starts cold.
  A pool container is an ordinary sandbox container (the same create code, the same
  hardening), started with a pool id, ``pool-<owner>-<random>``, as its sandbox id, the
  label ``<prefix>.pool=<owner>``, and its agent answering (a ping) before it is offered.
* **Claiming** (one use only). The container is taken out of this process's idle list
  under a lock, then renamed from its pool name to the sandbox's container name. The rename
  goes by the old *name*, so it succeeds once across every process and Engine client: a
  container is never handed to two sandboxes, and a taken sandbox id is refused (409) as a
  cold create refuses it. Nothing runs in a pool container before it is claimed, so its
  workspace and /tmp are empty and only the agent runs; its hostname, user, mounts and
  limits are those of a cold container of the same spec.
* **What Docker cannot change.** Labels are fixed at create. The claim therefore writes
  the sandbox's labels and the time of assignment to a record the server alone can read
  (claims.py: ``<agent_dir>/.claims/<container id>.json``, 0600 in a 0700 directory; never in the
  container), and `list_sandboxes`, `get` and `stats` show the record's labels and take the
  sandbox's age (created_at, uptime) from the assignment. Without the record (another
  host's server) the sandbox id still comes from the container's name.
* **Ownership.** Each process has its own pool, filled from its first create on (processes
  that never create keep none). Unclaimed containers carry their owner (a node id of this
  host's boot and pid namespace, the pid and its start time). `list_sandboxes` hides them
  while the owner runs, so the orphan reconciler leaves them alone, and shows them once it
  has died, so the reconciler removes them like any orphan; a new pool also removes the
  dead ones of this host at once. An owner that cannot be checked from here (another
  host or pid namespace) counts as gone once its container is older than `LEASE_S`; owners
  replace their own idle containers well before that. `close()` (and exit) removes the
  unclaimed ones.
* **Refilling** runs in `refill_concurrency` daemon threads and gives way to users: it
  waits while cold creates are in flight (a burst larger than the pool) and for a short
  quiet moment after a claim while idle containers remain.
* **Bursts.** `size` is the pool's floor. After a burst of creates that found it empty it
  refills towards the burst's size, at most `max_size`, once the burst's cold creates are
  done, and removes the surplus after a quiet spell (sandboxes/providers/burst_sizing.py):
  the next burst of that size finds its containers started.

`CreateGate` bounds the cold creates in flight against one Engine. Fifty creates at once
share two cores; started together, all of them finish near the end (every first command
waited about as long as the last). In a short queue the first ones finish early and the
last no later, which halves the median of a burst.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import secrets
import shutil
import socket
import threading
import time
import weakref
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import docker.errors

from sandboxes.providers.base import (
    InvalidRequest,
    ProviderError,
    Resources,
    SandboxHandle,
    SandboxSpec,
    SandboxState,
)
from sandboxes.providers.burst_sizing import BurstSizing
from sandboxes.providers.unix_sockets import reachable_path

from .claims import (
    LEASE_S,
    NODE,
    POOL_ID_PREFIX,
    POOL_LABEL,
    owner_alive,
    owner_token,
    unclaimed,
    write_claim,
)
from .errors import translate

logger = logging.getLogger(__name__)

MEMORY_LABEL = "memory_mb"
"""The memory limit label Engine placement adds up (engines.py); pool containers carry it."""
RECYCLE_S = LEASE_S / 3
"""Owners replace their idle containers at this age, well inside the lease."""
QUIET_S = 0.05
"""After a claim, a refill waits this long while idle containers remain, so it does not
slow down the first commands of the sandbox just handed out."""
CLOSE_WAIT_S = 15.0
CLOSE_PARALLEL = 8
MAX_BACKOFF_S = 30.0


class _Provider(Protocol):
    """What the pool uses of DockerProvider (kept narrow; see provider.py)."""

    image: str
    runtime: str
    label_prefix: str
    installation: str
    agent_dir: Path

    def _api(self) -> Any: ...
    def _label(self, key: str) -> str: ...
    def _start_new(self, spec: SandboxSpec) -> SandboxHandle: ...
    def _call(self, provider_id: str, request: dict[str, Any], timeout: float = ...) -> Any: ...
    def _agent_socket_path(self, provider_id: str) -> Path | None: ...
    def destroy(self, provider_id: str) -> bool: ...


# --- which specs are pooled ------------------------------------------------------------


def poolable(provider: _Provider, spec: SandboxSpec) -> bool:
    """Whether a pool container is exactly what a cold create of `spec` would start."""
    return (
        not spec.network
        and not spec.env
        and spec.resources == Resources()
        and (spec.runtime or provider.runtime) == provider.runtime
        and getattr(spec, "image", "") in ("", provider.image)
        and not getattr(spec, "restore_from", "")
        and spec.template == "default"
        and not spec.sandbox_id.startswith(POOL_ID_PREFIX)
    )


# --- the gate for cold creates ----------------------------------------------------------


class CreateGate:
    """At most `limit` cold creates at once (0: no limit), and whether any is in flight."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._slots = threading.BoundedSemaphore(limit) if limit > 0 else None
        self._lock = threading.Lock()
        self._in_flight = 0

    @contextlib.contextmanager
    def cold(self) -> Iterator[None]:
        with self._lock:
            self._in_flight += 1
        try:
            if self._slots is None:
                yield
            else:
                with self._slots:
                    yield
        finally:
            with self._lock:
                self._in_flight -= 1

    def busy(self) -> bool:
        with self._lock:
            return self._in_flight > 0


# --- the pool -----------------------------------------------------------------------------


@dataclass
class PooledContainer:
    """An unclaimed container: its id, pool id and when it became ready (monotonic)."""

    cid: str
    pool_id: str
    ready_at: float


class DockerPool:
    """`size` idle containers of `provider`'s common spec (up to `max_size` after a burst),
    thread-safe (see the module docstring). `claim(spec, labels)` hands one to one caller
    only."""

    def __init__(
        self,
        provider: _Provider,
        size: int,
        gate: CreateGate,
        refill_concurrency: int = 2,
        max_size: int | None = None,
    ) -> None:
        self.provider = provider
        self.size = size
        self.max_size = max(size, max_size or 0)
        self.gate = gate
        self.refill_concurrency = max(1, refill_concurrency)
        self._reset()
        ref = weakref.ref(self)
        atexit.register(_close_at_exit, ref)
        os.register_at_fork(after_in_child=lambda: _reset_after_fork(ref))

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._cond = threading.Condition(threading.Lock())
        self._idle: list[PooledContainer] = []
        self._starting = 0
        self._closed = False
        self._failures = 0
        self._last_claim = 0.0
        self._threads: list[threading.Thread] = []
        self._swept = False
        self._sweep_lock = threading.Lock()
        self._sizing = BurstSizing(self.size, self.max_size)

    # -- public --------------------------------------------------------------------------

    def idle_count(self) -> int:
        with self._cond:
            return len(self._idle)

    def idle_ids(self) -> list[str]:
        with self._cond:
            return [warm.cid for warm in self._idle]

    def target(self) -> int:
        """How many idle containers the pool refills to now (`size`, more after a burst)."""
        with self._cond:
            return self._sizing.target()

    def start(self) -> None:
        """Start filling now, before the first claim (a web process about to serve)."""
        self._wake()

    def wait_full(self, timeout_s: float) -> bool:
        """Start filling if not yet, and wait until the target of containers are idle."""
        with self._cond:
            self._wake_locked()
            return self._cond.wait_for(lambda: len(self._idle) >= self._sizing.target(), timeout_s)

    def claim(self, spec: SandboxSpec, labels: Mapping[str, str]) -> SandboxHandle | None:
        """The sandbox `spec` in a pool container, or None (not poolable, pool empty, or
        the container turned out unusable: the caller creates it cold). `labels` are the
        ones a cold create would give it. InvalidRequest when the sandbox id is taken."""
        if not poolable(self.provider, spec):
            return None
        while True:
            with self._cond:
                if self._closed or not self._idle:
                    if not self._closed and self._threads:  # not the first create: a miss
                        self._sizing.miss()
                    self._wake_locked()
                    return None
                warm = self._idle.pop(0)
                self._last_claim = time.monotonic()
            try:
                return self._assign(warm, spec, labels)
            except _Taken:
                with self._cond:  # still unclaimed: back to the pool
                    self._idle.insert(0, warm)
                raise InvalidRequest(f"Sandbox {spec.sandbox_id} already exists.") from None
            except Exception:  # noqa: BLE001 - an unusable container: drop it, try the next
                logger.warning("could not claim pool container %s", warm.cid, exc_info=True)
                self._destroy_quietly(warm.cid)
            finally:
                self._wake()

    def close(self, wait: bool = False) -> None:
        """Stop refilling and remove every unclaimed container. Idempotent. A container
        still starting is removed by its refill thread when it is up; `wait` (at exit)
        waits for that."""
        with self._cond:
            if self._pid != os.getpid():  # a forked child's copy owns nothing
                return
            self._closed = True
            idle, self._idle = self._idle, []
            threads = list(self._threads)
            self._cond.notify_all()
        cids = [warm.cid for warm in idle]
        try:  # in parallel: a large pool must go within a server's stop timeout
            with ThreadPoolExecutor(max(1, min(len(cids), CLOSE_PARALLEL))) as removing:
                list(removing.map(self._destroy_quietly, cids))
        except RuntimeError:  # at exit executors refuse work: plain threads, else in turn
            self._remove_at_exit(cids)
        for thread in threads if wait else []:
            if thread is not threading.current_thread():
                thread.join(CLOSE_WAIT_S)

    def _destroy_all(self, cids: list[str]) -> None:
        for cid in cids:
            self._destroy_quietly(cid)

    def _remove_at_exit(self, cids: list[str]) -> None:
        chunks = [cids[i::CLOSE_PARALLEL] for i in range(min(len(cids), CLOSE_PARALLEL))]
        threads = []
        for chunk in chunks:
            thread = threading.Thread(target=self._destroy_all, args=(chunk,))
            try:
                thread.start()
            except RuntimeError:  # no threads either: this one removes the chunk
                thread.run()
            threads.append(thread)
        for thread in threads:
            if thread.ident is not None:
                thread.join(CLOSE_WAIT_S)

    # -- claiming ----------------------------------------------------------------------------

    def _assign(
        self, warm: PooledContainer, spec: SandboxSpec, labels: Mapping[str, str]
    ) -> SandboxHandle:
        provider = self.provider
        sock_path = provider._agent_socket_path(warm.cid)
        if sock_path is not None:  # a dead container's agent no longer listens: cheap check
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.settimeout(1.0)
                with reachable_path(sock_path) as path:
                    probe.connect(path)
        pool_name = f"{provider.label_prefix}-{provider.installation}-{warm.pool_id}"
        name = f"{provider.label_prefix}-{provider.installation}-{spec.sandbox_id}"
        with translate(warm.cid):
            try:
                provider._api().rename(pool_name, name)
            except docker.errors.APIError as exc:
                if exc.status_code == 409:  # the name is taken: this container stays unclaimed
                    raise _Taken from exc
                raise
        now = datetime.now(UTC)
        try:
            write_claim(provider, warm.cid, labels, now)
        except BaseException:
            with contextlib.suppress(Exception):
                provider.destroy(warm.cid)
            raise
        return SandboxHandle(
            provider="docker",
            provider_id=warm.cid,
            state=SandboxState.RUNNING,
            created_at=now,
            labels=dict(labels),
        )

    # -- refilling ---------------------------------------------------------------------------

    def _spawn(self) -> PooledContainer:
        provider = self.provider
        owner = owner_token()
        pool_id = f"{POOL_ID_PREFIX}{owner}-{secrets.token_hex(4)}"
        spec = SandboxSpec(
            sandbox_id=pool_id,
            labels={
                provider._label(POOL_LABEL): owner,
                provider._label(MEMORY_LABEL): str(Resources().memory_mb),
            },
        )
        handle = provider._start_new(spec)
        try:
            provider._call(handle.provider_id, {"op": "ping"})  # agent-ready before offered
        except BaseException:
            self._destroy_quietly(handle.provider_id)
            raise
        return PooledContainer(handle.provider_id, pool_id, time.monotonic())

    def _wake(self) -> None:
        with self._cond:
            self._wake_locked()

    def _wake_locked(self) -> None:
        if self._closed or self.size <= 0:
            return
        while len(self._threads) < self.refill_concurrency:
            thread = threading.Thread(target=self._run, name="sandpit-docker-pool", daemon=True)
            self._threads.append(thread)
            thread.start()
        self._cond.notify_all()

    def _wanted_locked(self) -> bool:
        """Whether a refill thread has work: closing, containers to start, or a burst's
        surplus to remove."""
        target = self._sizing.target()
        idle = len(self._idle)
        return self._closed or idle + self._starting < target or idle > target

    def _run(self) -> None:
        self._sweep_once()
        while True:
            with self._cond:
                self._cond.wait_for(self._wanted_locked, RECYCLE_S / 8)
                if self._closed:
                    return
                stale = self._pop_stale_locked()
                if stale is None and len(self._idle) > self._sizing.target():
                    stale = self._idle.pop()  # a burst's surplus, once the target fell
                if stale is None and not self._wanted_locked():
                    continue
                if stale is None:
                    # Give way to users: cold creates in flight, or a claim just now.
                    quiet_for = time.monotonic() - self._last_claim
                    if self.gate.busy() or (self._idle and quiet_for < QUIET_S):
                        self._cond.wait(QUIET_S)
                        continue
                    self._starting += 1
            if stale is not None:
                self._destroy_quietly(stale.cid)
                continue
            warm: PooledContainer | None = None
            try:
                warm = self._spawn()
            except Exception:  # noqa: BLE001 - keep the thread; creates fall back to cold
                logger.warning("could not start a pool container", exc_info=True)
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
                self._destroy_quietly(warm.cid)
            if failures:  # back off so a broken engine does not spin a core
                time.sleep(min(MAX_BACKOFF_S, 0.1 * 2**failures))

    def _pop_stale_locked(self) -> PooledContainer | None:
        if self._idle and time.monotonic() - self._idle[0].ready_at > RECYCLE_S:
            return self._idle.pop(0)
        return None

    def _sweep_once(self) -> None:
        """Remove the unclaimed containers of dead owners on this node (a server that
        stopped without closing its pool; the reconciler would, after its grace). The
        other refill threads wait for it."""
        with self._sweep_lock:
            if not self._swept:
                self._sweep()
                self._swept = True

    def _sweep(self) -> None:
        """Of every installation: an unclaimed container of a process of this node that is
        gone was never a sandbox and never will be (a test server killed with SIGKILL, in
        an installation nothing reconciles afterwards, leaves one)."""
        provider = self.provider
        try:
            with translate():
                rows = provider._api().containers(
                    all=True, filters={"label": [provider._label(POOL_LABEL)]}
                )
        except ProviderError:
            logger.warning("could not list pool containers", exc_info=True)
            return
        for row in rows:
            labels = row.get("Labels") or {}
            owner = str(labels.get(provider._label(POOL_LABEL)) or "")
            name = str((row.get("Names") or [""])[0])
            created = datetime.fromtimestamp(int(row.get("Created") or 0), UTC)
            if (
                owner.startswith(f"{NODE}-")
                and unclaimed(provider, name, labels)
                and not owner_alive(owner, created)
            ):
                self._remove_leftover(row)

    def _remove_leftover(self, row: Mapping[str, Any]) -> None:
        """Remove a dead pool's container (maybe another installation's: not through
        destroy, which refuses those) and its agent directory when it is under ours."""
        try:
            with translate(row["Id"]):
                self.provider._api().remove_container(row["Id"], force=True, v=True)
        except ProviderError:
            logger.warning("could not remove pool container %s", row["Id"], exc_info=True)
            return
        for mount in row.get("Mounts") or []:
            source = Path(str(mount.get("Source") or ""))
            if source.parent == Path(self.provider.agent_dir) and source.name:
                shutil.rmtree(source, ignore_errors=True)

    def _destroy_quietly(self, cid: str) -> None:
        try:
            self.provider.destroy(cid)
        except Exception:  # noqa: BLE001 - best effort; the reconciler is the backstop
            logger.warning("could not remove pool container %s", cid, exc_info=True)


class _Taken(Exception):
    """The sandbox's container name is taken (a duplicate sandbox id)."""


def _close_at_exit(ref: weakref.ref[DockerPool]) -> None:
    pool = ref()
    if pool is not None:
        pool.close(wait=True)


def _reset_after_fork(ref: weakref.ref[DockerPool]) -> None:
    pool = ref()
    if pool is not None:
        pool._reset()
