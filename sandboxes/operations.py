"""Fleet operations: the reaper (idle and max-lifetime sandboxes) and the reconciler
(provider resources without a live row, live rows without a provider resource).

Safe by construction, with several workers at once and across crashes:

* The commit point of every destroy is a conditional UPDATE of the row's state
  (`sandbox_transition`; for idle reaps `sandbox_destroy(only_if_idle=True)`, a compare-and-set). Only the
  caller whose UPDATE matched calls `provider.destroy`, so two reapers never destroy one
  sandbox twice, and no lock is held while a provider call runs. We chose this over
  `select_for_update(skip_locked=True)` (a transaction held open across provider calls,
  which can take seconds and would hold row locks all that time) and over a Redis lock (one more moving part that can expire
  mid-run; it would only save duplicate reads, which are cheap).
* The idle reap is a compare-and-set on (state, last_activity_at, timeout_s) as read
  before the checks: activity recorded in between (a keystroke, an API call, a process
  found running) makes the UPDATE match nothing, so the sandbox survives.
* A worker killed between the commit and `provider.destroy` leaves a destroyed row with a
  live resource. Every reap and reconcile run sweeps such leftovers (resources whose row
  is not live, once the decision is older than the grace period), so the next run
  completes the destroy. Resources with no row at all are orphans, removed after the same
  grace period, so an in-flight create is never touched.
* Every sandbox is handled in its own try/except: one failure is logged with its sandbox
  id and counted, and the run goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from common import metrics
from common.logging import sandbox_id_var

from .models import Sandbox, SandboxState
from .provider_access import provider_for, sandbox_transition
from .providers import configured_provider_names, get_provider
from .providers.base import Capability, ExecRequest, ProviderError, SandboxGone, SandboxHandle
from .providers.base import SandboxState as HandleState
from .services import sandbox_destroy
from .snapshots import paused_sandboxes_archive, stale_snapshots_remove

logger = logging.getLogger(__name__)

SANDBOX_ID_LABEL = "sandpit.sandbox_id"
"""The label the Docker provider puts on each container; the local provider's
provider_id is the sandbox id itself."""

REASON_IDLE = "idle"
REASON_MAX_LIFETIME = "max_lifetime"
REASON_VANISHED = "vanished"
REASON_STALE_CREATE = "create_interrupted"
REASON_ORPHAN = "orphan"
REASON_ERROR = "error"


# --- settings (documented defaults; see the README, Operations) -------------------------------------


def orphan_grace_s() -> int:
    """Seconds a provider resource without a live row is left alone (an in-flight create,
    or a destroy another worker is finishing). Default 60."""
    return int(getattr(settings, "SANDPIT_ORPHAN_GRACE_S", 60))


def create_stale_s() -> int:
    """Seconds after which a row still in `creating` is treated as an interrupted create.
    Default 600."""
    return int(getattr(settings, "SANDPIT_CREATE_STALE_S", 600))


def pre_stop_hook_timeout_s() -> float:
    """Seconds the pre-stop hook may run before the reap goes ahead anyway. Default 10."""
    return float(getattr(settings, "SANDPIT_PRE_STOP_HOOK_TIMEOUT_S", 10))


def reap_batch_size() -> int:
    """Most sandboxes one reap run looks at (oldest activity first). Default 500."""
    return int(getattr(settings, "SANDPIT_REAP_BATCH", 500))


# --- reports -----------------------------------------------------------------------------


@dataclass
class ReapReport:
    """What one reap run did; counts of sandboxes."""

    checked: int = 0
    reaped_idle: list[str] = field(default_factory=list)
    reaped_max_lifetime: list[str] = field(default_factory=list)
    kept_alive: list[str] = field(default_factory=list)
    """Idle by the clock but running user processes: activity was bumped instead."""
    failed: list[str] = field(default_factory=list)
    archived: list[str] = field(default_factory=list)
    """Paused past SANDPIT_PAUSED_ARCHIVE_AFTER_S (or their max lifetime): snapshotted and
    stopped (sandboxes/snapshots.py)."""
    leftovers: ReconcileReport | None = None


@dataclass
class ReconcileReport:
    """What one reconcile run did."""

    orphans_destroyed: list[str] = field(default_factory=list)
    """provider_ids removed because no live row owns them."""
    vanished: list[str] = field(default_factory=list)
    """Sandbox ids whose provider resource was gone: marked error, then destroyed."""
    stale_creates: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    provider_errors: list[str] = field(default_factory=list)
    """Providers whose list() failed (skipped this run)."""


@contextmanager
def _sandbox_context(sandbox_id: str) -> Iterator[None]:
    """Every log line inside carries the sandbox id (the JSON formatter prints it)."""
    token = sandbox_id_var.set(sandbox_id)
    try:
        yield
    finally:
        sandbox_id_var.reset(token)


def _provider_error(provider: str, operation: str) -> None:
    metrics.counter_inc("provider_errors", provider=provider, operation=operation)


# --- the reaper ---------------------------------------------------------------------------


def _idle_deadline(sandbox: Sandbox) -> datetime:
    return sandbox.last_activity_at + timedelta(seconds=sandbox.timeout_s)


def _running_user_processes(sandbox: Sandbox) -> int:
    """How many user processes (dev servers, background jobs) run in the sandbox.
    Raises ProviderError when the provider cannot tell. A provider without background
    processes has none to keep the sandbox alive: 0, so the idle timeout, which is the
    reaper's on every provider, still ends it."""
    provider = provider_for(sandbox)
    if Capability.PROCESSES not in provider.capabilities:
        return 0
    processes = provider.list_processes(sandbox.provider_id)
    return sum(1 for process in processes if process.running)


def _pre_stop_hook(sandbox: Sandbox) -> str:
    hook = sandbox.metadata.get("pre_stop_hook") if isinstance(sandbox.metadata, dict) else None
    return str(hook or getattr(settings, "SANDPIT_PRE_STOP_HOOK", "") or "")


def run_pre_stop_hook(sandbox: Sandbox) -> None:
    """Run the sandbox's pre-stop hook (metadata "pre_stop_hook", else the
    SANDPIT_PRE_STOP_HOOK setting) with a short timeout. Never raises: a failing hook is
    logged and the reap goes ahead. Not counted as activity (it calls the provider
    directly, not through the services that touch the row)."""
    hook = _pre_stop_hook(sandbox)
    if not hook or not sandbox.provider_id:
        return
    try:
        result = provider_for(sandbox).exec(
            sandbox.provider_id,
            ExecRequest(command=hook, timeout_s=pre_stop_hook_timeout_s(), max_output_bytes=4096),
        )
    except ProviderError as exc:
        logger.warning("pre-stop hook could not run: %s", exc.message)
        return
    if result.exit_code != 0 or result.timed_out:
        logger.warning(
            "pre-stop hook exited %s%s",
            result.exit_code,
            " (timed out)" if result.timed_out else "",
        )


def _reap_one(sandbox: Sandbox, now: datetime, report: ReapReport) -> None:
    if sandbox.expires_at <= now:
        # Max lifetime: reaped regardless of activity.
        run_pre_stop_hook(sandbox)
        if sandbox_destroy(sandbox=sandbox, reason=REASON_MAX_LIFETIME):
            report.reaped_max_lifetime.append(sandbox.id)
            metrics.counter_inc("sandboxes_reaped", reason=REASON_MAX_LIFETIME)
        return
    if _idle_deadline(sandbox) > now:
        return
    try:
        running = _running_user_processes(sandbox)
    except SandboxGone:
        # The reconciler's job (marks error with a message, then destroys).
        logger.info("sandbox vanished from its provider; left to the reconciler")
        return
    except ProviderError as exc:
        # Cannot tell whether work is running: keep it, try again next run.
        _provider_error(sandbox.provider, "list_processes")
        logger.warning("cannot list processes, not reaping this run: %s", exc.message)
        report.failed.append(sandbox.id)
        return
    if running:
        # A dev server or long job is activity: bump, conditionally, so we never move
        # last_activity_at backwards over a fresher touch.
        Sandbox.objects.filter(state=SandboxState.RUNNING, last_activity_at__lt=now).update_row(
            sandbox.pk, last_activity_at=now
        )
        report.kept_alive.append(sandbox.id)
        logger.info("idle by the clock but %d user process(es) running: kept", running)
        return
    run_pre_stop_hook(sandbox)
    if sandbox_destroy(sandbox=sandbox, reason=REASON_IDLE, only_if_idle=True):
        report.reaped_idle.append(sandbox.id)
        metrics.counter_inc("sandboxes_reaped", reason=REASON_IDLE)


def reap_sandboxes(*, now: datetime | None = None, sweep_leftovers: bool = True) -> ReapReport:
    """Destroy running sandboxes idle past their timeout (no activity for `timeout_s` and no
    running user process) or past `expires_at`, recording why in destroy_reason ("idle",
    "max_lifetime"). Then finish any destroy an earlier run was killed in the middle of.
    Idempotent and safe to run from several workers at once. Never raises for one
    sandbox's failure; see the report."""
    now = now or timezone.now()
    report = ReapReport()
    shortest_timeout = timedelta(seconds=1)
    candidates = (
        Sandbox.objects.filter(state=SandboxState.RUNNING, provider__in=configured_provider_names())
        .filter(Q(expires_at__lte=now) | Q(last_activity_at__lte=now - shortest_timeout))
        .order_by("last_activity_at")[: reap_batch_size()]
    )
    for sandbox in candidates:
        if sandbox.expires_at > now and _idle_deadline(sandbox) > now:
            continue
        report.checked += 1
        with _sandbox_context(sandbox.id):
            try:
                _reap_one(sandbox, now, report)
            except Exception:  # noqa: BLE001 - isolate one sandbox's failure from the fleet
                report.failed.append(sandbox.id)
                logger.exception("reaping failed")
    # Paused sandboxes are not idle (their clock stopped) but do not stay paused forever.
    report.archived = paused_sandboxes_archive(now=now)
    stale_snapshots_remove(now=now)  # snapshots whose taker died mid-way
    if report.archived:
        logger.info("reaper: %d paused sandboxes archived", len(report.archived))
    if report.reaped_idle or report.reaped_max_lifetime or report.kept_alive or report.failed:
        logger.info(
            "reaper: %d idle, %d max lifetime, %d kept alive, %d failed",
            len(report.reaped_idle),
            len(report.reaped_max_lifetime),
            len(report.kept_alive),
            len(report.failed),
        )
    if sweep_leftovers:
        report.leftovers = reconcile_orphans()
    metrics.counter_inc("reaper_runs", task="reap")
    return report


# --- the reconciler ------------------------------------------------------------------------


def _handle_sandbox_id(handle: SandboxHandle) -> str:
    return str(handle.labels.get(SANDBOX_ID_LABEL) or handle.provider_id)


def _destroy_orphan(provider_name: str, handle: SandboxHandle, report: ReconcileReport) -> None:
    provider = get_provider(provider_name)
    if provider.destroy(handle.provider_id):
        report.orphans_destroyed.append(handle.provider_id)
        metrics.counter_inc("sandboxes_reaped", reason=REASON_ORPHAN)
        logger.warning("destroyed orphan %s resource %s", provider_name, handle.provider_id)


def _reconcile_provider_orphans(provider_name: str, now: datetime, report: ReconcileReport) -> None:
    provider = get_provider(provider_name)
    # List first, then read the rows: every resource listed was created after its row was
    # committed (sandbox_create inserts the row before calling the provider), so a create
    # in flight always finds its row in the query below.
    try:
        handles = provider.list_sandboxes()
    except ProviderError as exc:
        _provider_error(provider_name, "list")
        report.provider_errors.append(provider_name)
        logger.warning("cannot list %s sandboxes: %s", provider_name, exc.message)
        return
    if not handles:
        return
    ids = {_handle_sandbox_id(h) for h in handles}
    pids = {h.provider_id for h in handles}
    rows = {
        row["id"]: row
        for row in Sandbox.objects.filter(provider=provider_name)
        .filter(Q(id__in=ids) | Q(provider_id__in=pids))
        .values("id", "provider_id", "state", "destroyed_at", "stopped_at", "created_at")
    }
    by_pid = {row["provider_id"]: row for row in rows.values() if row["provider_id"]}
    grace = timedelta(seconds=orphan_grace_s())
    for handle in handles:
        sandbox_id = _handle_sandbox_id(handle)
        row = rows.get(sandbox_id) or by_pid.get(handle.provider_id)
        with _sandbox_context(row["id"] if row else sandbox_id):
            try:
                if row is None:
                    # Created behind the app's back, or its row was deleted.
                    if handle.created_at <= now - grace:
                        _destroy_orphan(provider_name, handle, report)
                    continue
                if row["state"] not in (
                    SandboxState.DESTROYED,
                    SandboxState.ERROR,
                    SandboxState.ARCHIVED,  # an archived sandbox keeps only its snapshot
                ):
                    continue  # live (or stopped, which keeps its resource by design)
                # The row is destroyed (or error) but the resource lives: a destroy that
                # crashed or failed, or a create that failed half-way. Wait out the grace so
                # we do not race the worker that is finishing it right now.
                decided_at = row["destroyed_at"] or row["stopped_at"] or row["created_at"]
                if decided_at > now - grace:
                    continue
                if row["state"] == SandboxState.ERROR:
                    Sandbox.objects.filter(state=SandboxState.ERROR).update_row(
                        row["id"],
                        state=SandboxState.DESTROYED,
                        destroyed_at=now,
                        destroy_reason=REASON_ERROR,
                    )
                _destroy_orphan(provider_name, handle, report)
            except Exception:  # noqa: BLE001 - one resource's failure must not stop the sweep
                report.failed.append(handle.provider_id)
                logger.exception("could not destroy leftover %s", handle.provider_id)


def reconcile_orphans(*, now: datetime | None = None) -> ReconcileReport:
    """Destroy provider resources that no live row owns: never-known ones (after the grace
    period) and leftovers of destroys that crashed or failed. Idempotent."""
    now = now or timezone.now()
    report = ReconcileReport()
    for name in configured_provider_names():
        try:
            _reconcile_provider_orphans(name, now, report)
        except Exception:  # noqa: BLE001 - e.g. a provider that cannot even be built
            report.provider_errors.append(name)
            _provider_error(name, "reconcile")
            logger.exception("reconciling %s failed", name)
    return report


def _mark_vanished(sandbox: Sandbox, message: str, report: ReconcileReport) -> None:
    if sandbox_transition(
        sandbox, SandboxState.ERROR, error_message=message, stopped_at=timezone.now()
    ):
        logger.warning("sandbox vanished from its provider: %s", message)
    # Also when another worker (or the API's SandboxGone path) already moved it to error.
    if sandbox_destroy(sandbox=sandbox, reason=REASON_VANISHED):
        report.vanished.append(sandbox.id)
        metrics.counter_inc("sandboxes_reaped", reason=REASON_VANISHED)


def reconcile_vanished(*, now: datetime | None = None) -> ReconcileReport:
    """Live rows whose provider resource is gone (or dead) become `error` with an
    error_message, then `destroyed` (reason "vanished"). Rows stuck in `creating` past
    SANDPIT_CREATE_STALE_S are destroyed (reason "create_interrupted"); a resource their
    create left behind is then an orphan. Idempotent."""
    now = now or timezone.now()
    report = ReconcileReport()
    grace = timedelta(seconds=orphan_grace_s())
    for name in configured_provider_names():
        try:
            handles = {h.provider_id: h for h in get_provider(name).list_sandboxes()}
        except Exception as exc:  # noqa: BLE001 - skip this provider this run
            _provider_error(name, "list")
            report.provider_errors.append(name)
            logger.warning("cannot list %s sandboxes: %s", name, exc)
            continue
        running = Sandbox.objects.filter(
            provider=name, state=SandboxState.RUNNING, started_at__lte=now - grace
        ).exclude(provider_id="")
        for sandbox in running:
            with _sandbox_context(sandbox.id):
                try:
                    _check_vanished(sandbox, handles.get(sandbox.provider_id), report)
                except Exception:  # noqa: BLE001 - isolate per sandbox
                    report.failed.append(sandbox.id)
                    logger.exception("reconciling sandbox failed")
    # Rows left in error (a provider call found the sandbox gone, a create failed): their
    # message stays for the user; the row moves on to destroyed once past the grace.
    errored = Sandbox.objects.filter(
        provider__in=configured_provider_names(), state=SandboxState.ERROR
    ).filter(
        Q(stopped_at__lte=now - grace) | Q(stopped_at__isnull=True, created_at__lte=now - grace)
    )
    for sandbox in errored:
        with _sandbox_context(sandbox.id):
            try:
                if sandbox_destroy(sandbox=sandbox, reason=REASON_ERROR):
                    report.vanished.append(sandbox.id)
                    metrics.counter_inc("sandboxes_reaped", reason=REASON_ERROR)
            except Exception:  # noqa: BLE001 - isolate per sandbox
                report.failed.append(sandbox.id)
                logger.exception("destroying an errored sandbox failed")
    stale = Sandbox.objects.filter(
        state=SandboxState.CREATING,
        created_at__lte=now - timedelta(seconds=create_stale_s()),
        provider__in=configured_provider_names(),
    )
    for sandbox in stale:
        with _sandbox_context(sandbox.id):
            try:
                sandbox_transition(
                    sandbox,
                    SandboxState.ERROR,
                    error_message="Creation was interrupted and never finished.",
                )
                if sandbox_destroy(sandbox=sandbox, reason=REASON_STALE_CREATE):
                    report.stale_creates.append(sandbox.id)
            except Exception:  # noqa: BLE001 - isolate per sandbox
                report.failed.append(sandbox.id)
                logger.exception("cleaning an interrupted create failed")
    return report


def _check_vanished(
    sandbox: Sandbox, handle: SandboxHandle | None, report: ReconcileReport
) -> None:
    provider = provider_for(sandbox)
    if handle is None:
        # Not listed: confirm with a direct lookup (the list may be a moment stale).
        try:
            handle = provider.get(sandbox.provider_id)
        except SandboxGone:
            _mark_vanished(sandbox, "The provider no longer has this sandbox.", report)
            return
        except ProviderError:
            _provider_error(sandbox.provider, "get")
            raise
    if handle.state in (HandleState.STOPPED, HandleState.ERROR, HandleState.GONE):
        _mark_vanished(sandbox, f"The provider reports the sandbox {handle.state.value}.", report)


def reconcile_sandboxes(*, now: datetime | None = None) -> ReconcileReport:
    """Both directions: orphan resources destroyed, vanished rows marked error then
    destroyed, interrupted creates cleaned. Idempotent; safe with several workers."""
    now = now or timezone.now()
    vanished = reconcile_vanished(now=now)
    orphans = reconcile_orphans()  # its own clock: after the destroys above
    metrics.counter_inc("reaper_runs", task="reconcile")
    report = ReconcileReport(
        orphans_destroyed=orphans.orphans_destroyed,
        vanished=vanished.vanished,
        stale_creates=vanished.stale_creates,
        failed=vanished.failed + orphans.failed,
        provider_errors=sorted(set(vanished.provider_errors + orphans.provider_errors)),
    )
    if report.orphans_destroyed or report.vanished or report.stale_creates or report.failed:
        logger.info(
            "reconciler: %d orphans, %d vanished, %d interrupted creates, %d failed",
            len(report.orphans_destroyed),
            len(report.vanished),
            len(report.stale_creates),
            len(report.failed),
        )
    return report


def report_summary(report: Any) -> dict[str, Any]:
    """A JSON-friendly summary for task results and logs."""
    out: dict[str, Any] = {}
    for key, value in vars(report).items():
        if isinstance(value, list):
            out[key] = len(value)
        elif isinstance(value, ReconcileReport):
            out[key] = report_summary(value)
        else:
            out[key] = value
    return out
