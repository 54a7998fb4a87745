"""Docker engines that stop answering: their sandboxes are lost.

Beat runs `engines_check` every SANDPIT_DOCKER_ENGINE_CHECK_INTERVAL_S. An engine that has
failed every check for SANDPIT_DOCKER_ENGINE_LOST_S (the first failure's time is kept in the
cache, Redis in production, so every worker sees the same clock) has its running and paused
sandboxes moved to `error` with a message naming the engine, and a status event goes to
their sockets. From there the reconciler treats them as any errored sandbox: the row is
destroyed after SANDPIT_ORPHAN_GRACE_S (the provider call fails at once while the engine
is down, which the destroy tolerates). New sandboxes go to the other engines meanwhile
(placement skips an engine that does not answer). When the engine answers again its
containers have no live row: the orphan reconciler, which lists every engine, removes them.

A sandbox is not brought back when its engine returns, even though its container may have
survived (dockerd with live-restore): by then its row may be destroyed and its id reused by
nobody, and a sandbox that vanished for a minute has lost its terminals and runs anyway.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from django.conf import settings
from django.core.cache import cache
from django.db.models import Q
from django.utils import timezone

from common import metrics

from .engines import docker_engines
from .events import sandbox_event_broadcast
from .models import Sandbox, SandboxState
from .provider_access import sandbox_transition

logger = logging.getLogger(__name__)

REASON_ENGINE_LOST = "engine_lost"


@dataclass
class EngineCheckReport:
    """What one check saw and did."""

    up: list[str] = field(default_factory=list)
    down: list[str] = field(default_factory=list)
    """Engines that did not answer this time (lost or not yet)."""
    lost: list[str] = field(default_factory=list)
    """Sandbox ids marked lost."""


def _down_key(engine: str) -> str:
    return f"docker-engine-down:{settings.SANDPIT_INSTALLATION}:{engine}"


def sandboxes_mark_lost(engine: str, detail: str, *, first: bool = False) -> list[str]:
    """Move every running or paused docker sandbox on `engine` to error, with a message
    naming the engine, and tell its sockets. Idempotent (a conditional transition each).
    `first`: the first engine listed, which also runs the rows made before rows recorded
    their engine (engine ''). Returns the ids marked."""
    message = (
        f"Lost: the Docker engine '{engine}' running this sandbox stopped answering "
        f"({detail}). Its files and processes are gone from Sandpit's reach; create a new sandbox."
    )
    marked: list[str] = []
    rows = Sandbox.objects.filter(
        Q(engine=engine) | Q(engine="") if first else Q(engine=engine),
        provider="docker",
        state__in=(SandboxState.RUNNING, SandboxState.PAUSED),
    )
    for sandbox in rows:
        if sandbox_transition(
            sandbox, SandboxState.ERROR, error_message=message, stopped_at=timezone.now()
        ):
            marked.append(sandbox.id)
            sandbox_event_broadcast(
                sandbox.id,
                {
                    "type": "status",
                    "state": SandboxState.ERROR.value,
                    "reason": REASON_ENGINE_LOST,
                    "message": message,
                },
            )
    if marked:
        metrics.counter_inc("sandboxes_lost", amount=len(marked), engine=engine)
        logger.warning("docker engine %s lost: %d sandboxes marked error", engine, len(marked))
    return marked


def engines_check() -> EngineCheckReport:
    """Probe every docker engine; mark the sandboxes of one down for longer than
    SANDPIT_DOCKER_ENGINE_LOST_S lost. Idempotent; safe from several workers."""
    report = EngineCheckReport()
    engines = docker_engines()
    if engines is None:
        return report
    lost_after_s = float(settings.SANDPIT_DOCKER_ENGINE_LOST_S)
    for status in engines.engine_statuses():
        key = _down_key(status.name)
        if status.ok:
            report.up.append(status.name)
            cache.delete(key)
            continue
        report.down.append(status.name)
        now = time.time()
        cache.add(key, now, timeout=None)
        since = float(cache.get(key) or now)
        if now - since >= lost_after_s:
            report.lost += sandboxes_mark_lost(
                status.name, status.detail, first=status.name == engines.first
            )
        else:
            logger.warning(
                "docker engine %s is not answering (%.0f s of %.0f s before its sandboxes "
                "are lost): %s",
                status.name,
                now - since,
                lost_after_s,
                status.detail,
            )
    return report
