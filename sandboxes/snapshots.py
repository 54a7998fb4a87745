"""Snapshots, fork, pause and resume: services (one door each) and the reaper's archiving.

* A snapshot is an archive of a sandbox's /workspace and /tmp (everything it can write),
  taken running or paused; new sandboxes start from it (`sandbox_create(snapshot=...)`,
  or `sandbox_fork` in one step). Processes and memory are not part of it.
* Pause freezes every process of the sandbox with its memory (local: the jail's cgroup
  freezer; docker: `docker pause`). A paused sandbox keeps its place under the
  concurrent-sandboxes cap (it holds its memory), its idle clock stops (the reaper's idle
  and max-lifetime reaps look at running sandboxes only; resume counts as activity), and
  every operation on it but destroy, snapshot and resume is refused with 409
  'sandbox_paused': nothing resumes a sandbox implicitly, since resuming is counted and
  may restart it.
* The reaper archives a sandbox paused longer than SANDPIT_PAUSED_ARCHIVE_AFTER_S (or past
  its max lifetime): an 'archive' snapshot, then its provider resource is destroyed and the
  row becomes `archived` (no place under the cap). Resume then starts it again from that
  snapshot, with the same id and files but none of its processes, nor the environment
  variables it was created with; the archive snapshot is deleted once resumed.

Limits per organization: SANDPIT_MAX_SNAPSHOTS_PER_ORG snapshots (the reaper's archives are
not refused and not counted) and SANDPIT_MAX_SNAPSHOT_BYTES_PER_ORG bytes stored (archives
counted). Snapshots taken at the same moment may pass the byte limit by what they add.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q, QuerySet, Sum
from django.utils import timezone

from accounts.authentication import Principal
from accounts.models import Organization
from common.errors import Conflict, NotFound, QuotaExceeded

from .caller import Caller, metered
from .engines import engine_spec_labels, handle_engine
from .events import sandbox_event_broadcast
from .models import Sandbox, SandboxState, Snapshot, SnapshotState
from .provider_access import (
    fast_commit,
    provider_call,
    provider_for,
    require_capability,
    sandbox_transition,
)
from .providers import get_provider
from .providers.base import (
    Capability,
    CapabilityNotSupported,
    ProviderError,
    ResourceExhausted,
    Resources,
    SandboxSpec,
    SnapshotProvider,
)
from .providers.snapshot_archive import remove_archive
from .services import CAPPED_STATES, max_concurrent_sandboxes, sandbox_create, sandbox_touch
from .snapshot_store import ARCHIVE, FORK, MANUAL, snapshot_path
from .templates import template_for_sandbox
from .terminal_registry import terminals_close_for_sandbox

logger = logging.getLogger(__name__)

UNLIMITED_BYTES = 2**62


# --- selectors ------------------------------------------------------------------------------


def snapshot_get_for_principal(*, principal: Principal, snapshot_id: str) -> Snapshot:
    """The organization's snapshot; a miss, another organization's snapshot or a sandbox
    token all raise NotFound 'snapshot_not_found'."""
    if principal.token is None:
        found = (
            Snapshot.objects.filter(pk=snapshot_id, organization=principal.organization)
            .select_related("sandbox")
            .first()
        )
        if found is not None:
            return found
    raise NotFound("No such snapshot.", code="snapshot_not_found")


def snapshots_for_org(
    organization: Organization, *, sandbox: Sandbox | None = None
) -> QuerySet[Snapshot]:
    """The organization's snapshots (of `sandbox` only, when given), newest first; a fork's
    passing snapshot is not listed."""
    qs = Snapshot.objects.filter(organization=organization).exclude(kind=FORK)
    if sandbox is not None:
        qs = qs.filter(sandbox=sandbox)
    return qs.order_by("-created_at")


def snapshot_usage(organization: Organization) -> tuple[int, int]:
    """(snapshots counted against the limit, bytes stored) for `organization`."""
    rows = Snapshot.objects.filter(organization=organization)
    count = rows.filter(kind=MANUAL).count()
    stored = rows.aggregate(total=Sum("size_bytes"))["total"] or 0
    return count, int(stored)


# --- snapshots ------------------------------------------------------------------------------


def _snapshotting(sandbox: Sandbox, capability: Capability) -> SnapshotProvider:
    provider = provider_for(sandbox)
    require_capability(provider, capability)
    if not isinstance(provider, SnapshotProvider):
        raise CapabilityNotSupported(f"The '{provider.name}' provider cannot do this.")
    return provider


def _room(organization: Organization, kind: str) -> int:
    """Bytes a new snapshot of `kind` may store. Raises QuotaExceeded
    'snapshot_limit_reached' (a manual one past the count) or 'snapshot_storage_full' (a
    manual or fork one without bytes left); the reaper's archives are never refused."""
    if kind == ARCHIVE:
        return UNLIMITED_BYTES
    count, stored = snapshot_usage(organization)
    limit = settings.SANDPIT_MAX_SNAPSHOTS_PER_ORG
    if kind == MANUAL and count >= limit:
        raise QuotaExceeded(
            f"This organization has {count} snapshots (limit {limit}). Delete one "
            "(DELETE /api/v1/snapshots/{id}) and retry.",
            code="snapshot_limit_reached",
        )
    room = settings.SANDPIT_MAX_SNAPSHOT_BYTES_PER_ORG - stored
    if room <= 0:
        raise QuotaExceeded(
            f"This organization's snapshots take {stored:,} bytes (limit "
            f"{settings.SANDPIT_MAX_SNAPSHOT_BYTES_PER_ORG:,}). Delete some and retry.",
            code="snapshot_storage_full",
        )
    return room


def _take(sandbox: Sandbox, *, kind: str, name: str = "") -> Snapshot:
    """Archive the sandbox's files into a new ready Snapshot (see the module docstring for
    limits). The row exists while the provider works (state creating), so concurrent
    snapshots see it; on failure the row and any partial file go."""
    if sandbox.state not in (SandboxState.RUNNING, SandboxState.PAUSED):
        raise Conflict(
            f"Sandbox {sandbox.id} is {sandbox.state}: only a running or paused sandbox can "
            "be snapshotted.",
            code="sandbox_not_running",
        )
    provider = _snapshotting(sandbox, Capability.SNAPSHOT)
    organization = sandbox.organization
    with fast_commit():
        # One snapshot at a time per organization past the limit checks.
        Organization.objects.select_for_update().filter(pk=organization.pk).first()
        room = _room(organization, kind)
        row = Snapshot.objects.create(
            organization=organization,
            sandbox=sandbox,
            source_sandbox_id=sandbox.id,
            provider=sandbox.provider,
            template=sandbox.template,
            name=name,
            kind=kind,
            state=SnapshotState.CREATING,
        )
        row.location = str(snapshot_path(organization.pk, row.id))
        row.save(update_fields=["location"])
    try:
        result = provider_call(sandbox, provider.snapshot, sandbox.provider_id, row.location, room)
    except ResourceExhausted as exc:
        row.delete()  # the receiver removes a partial file
        raise QuotaExceeded(exc.message, code="snapshot_storage_full") from None
    except BaseException:
        row.delete()
        raise
    row.state, row.size_bytes = SnapshotState.READY, result.size_bytes
    if not Snapshot.objects.filter(pk=row.pk).update(state=row.state, size_bytes=row.size_bytes):
        # Its organization was deleted meanwhile: the row is gone, the file must go too.
        remove_archive(result.location)
        raise Conflict("The snapshot was deleted while it was being taken.", code="conflict")
    return row


def snapshot_create(*, caller: Caller, sandbox: Sandbox, name: str = "") -> Snapshot:
    """Snapshot a running or paused sandbox (counted once, 'snapshot.create'). Raises
    QuotaExceeded (429) past the organization's snapshot limits, Conflict when the sandbox
    is not running or paused, CapabilityNotSupported (501) on providers without snapshots."""
    with metered(caller, feature="sandbox", operation="snapshot.create"):
        snapshot = _take(sandbox, kind=MANUAL, name=name)
    if sandbox.state == SandboxState.RUNNING:
        sandbox_touch(sandbox)
    return snapshot


def snapshot_delete(*, snapshot: Snapshot) -> None:
    """Delete a snapshot and its archive. Not counted (it runs nothing in a sandbox and
    frees storage). Conflict 'snapshot_in_use' for the archive an archived sandbox would
    resume from: destroy that sandbox instead. Sandboxes started from it keep running."""
    if snapshot.state == SnapshotState.CREATING:
        raise Conflict(
            f"Snapshot {snapshot.id} is still being taken; delete it once it is ready.",
            code="snapshot_not_ready",
        )
    owner = snapshot.sandbox
    if snapshot.kind == ARCHIVE and owner is not None and owner.state == SandboxState.ARCHIVED:
        raise Conflict(
            f"Snapshot {snapshot.id} holds archived sandbox {owner.id}, which resumes from it; "
            f"destroy that sandbox (DELETE /api/v1/sandboxes/{owner.id}) instead.",
            code="snapshot_in_use",
        )
    snapshot.delete()


def sandbox_fork(*, caller: Caller, principal: Principal, sandbox: Sandbox) -> Sandbox:
    """A new sandbox with a copy of `sandbox`'s files (counted once, 'sandbox.fork'): a
    passing snapshot, a create from it, then the snapshot is deleted. Its steps are not
    counted on their own. Raises what snapshot_create and sandbox_create raise."""
    step = caller.unbilled()
    with metered(caller, feature="sandbox", operation="sandbox.fork"):
        passing = _take(sandbox, kind=FORK)
        try:
            fork = sandbox_create(
                principal=principal,
                caller=step,
                snapshot=passing,
                timeout_s=sandbox.timeout_s,
                network=sandbox.network,
                metadata={"forked_from": sandbox.id},
            )
        finally:
            passing.delete()
    return fork


# --- pause and resume ---------------------------------------------------------------------------


def sandbox_pause(*, caller: Caller, sandbox: Sandbox) -> Sandbox:
    """Freeze a running sandbox's processes, memory kept (counted once, 'sandbox.pause');
    a paused one is left as it is. Conflict 'sandbox_not_running' otherwise."""
    with metered(caller, feature="sandbox", operation="sandbox.pause"):
        if sandbox.state == SandboxState.PAUSED:
            return sandbox
        if sandbox.state != SandboxState.RUNNING:
            raise Conflict(
                f"Sandbox {sandbox.id} is {sandbox.state}, not running.",
                code="sandbox_not_running",
            )
        provider = _snapshotting(sandbox, Capability.PAUSE)
        provider_call(sandbox, provider.pause, sandbox.provider_id)
        if not sandbox_transition(
            sandbox,
            SandboxState.PAUSED,
            where={"state": SandboxState.RUNNING},
            paused_at=timezone.now(),
        ):
            raise Conflict(f"Sandbox {sandbox.id} changed state meanwhile.", code="conflict")
    sandbox_event_broadcast(sandbox.id, {"type": "status", "state": "paused"})
    return sandbox


def sandbox_resume(*, caller: Caller, sandbox: Sandbox) -> Sandbox:
    """Thaw a paused sandbox, or start an archived one again from its archive (counted
    once, 'sandbox.resume'); a running one is left as it is. Resuming counts as activity.
    Raises QuotaExceeded (429) when an archived sandbox would pass the concurrent cap,
    Conflict when the sandbox is stopped or destroyed."""
    with metered(caller, feature="sandbox", operation="sandbox.resume"):
        if sandbox.state == SandboxState.RUNNING:
            return sandbox
        if sandbox.state == SandboxState.PAUSED:
            provider = _snapshotting(sandbox, Capability.PAUSE)
            provider_call(sandbox, provider.resume, sandbox.provider_id)
            now = timezone.now()
            if not sandbox_transition(
                sandbox,
                SandboxState.RUNNING,
                where={"state": SandboxState.PAUSED},
                paused_at=None,
                last_activity_at=now,
            ):
                raise Conflict(f"Sandbox {sandbox.id} changed state meanwhile.", code="conflict")
        elif sandbox.state == SandboxState.ARCHIVED:
            _unarchive(sandbox)
        else:
            raise Conflict(
                f"Sandbox {sandbox.id} is {sandbox.state}; only a paused or archived sandbox "
                "can be resumed.",
                code="sandbox_not_running",
            )
    sandbox_event_broadcast(sandbox.id, {"type": "status", "state": "running"})
    return sandbox


def _unarchive(sandbox: Sandbox) -> None:
    """Start an archived sandbox's provider resource again from its archive snapshot."""
    archive = (
        Snapshot.objects.filter(sandbox=sandbox, kind=ARCHIVE, state=SnapshotState.READY)
        .order_by("-created_at")
        .first()
    )
    if archive is None:
        raise Conflict(f"Sandbox {sandbox.id} has no archive to resume from.", code="conflict")
    organization = sandbox.organization
    limit = max_concurrent_sandboxes(organization)
    held = Sandbox.objects.filter(organization=organization, state__in=CAPPED_STATES).count()
    if held >= limit:
        raise QuotaExceeded(
            f"This organization already has {held} live or paused sandboxes (limit {limit}). "
            "Destroy or archive one, then resume.",
            code="sandbox_limit_reached",
        )
    provider = get_provider(sandbox.provider)
    require_capability(provider, Capability.SNAPSHOT)
    # Its template's environment again (400/409 when the template went meanwhile).
    launch = template_for_sandbox(
        organization=organization, name=sandbox.template, provider_name=provider.name
    )
    docker = provider.name == "docker"
    known = set(Resources.__dataclass_fields__)
    resources = {k: v for k, v in (sandbox.resources or {}).items() if k in known}
    spec = SandboxSpec(
        sandbox_id=sandbox.id,
        template=sandbox.template,
        timeout_s=sandbox.timeout_s,
        lifetime_s=settings.SANDPIT_MAX_LIFETIME_S,
        network=sandbox.network,
        resources=Resources(**resources),
        labels={
            "sandpit.org": str(organization.pk),
            **(engine_spec_labels(organization, sandbox.template) if docker else {}),
        },
        runtime=organization.docker_runtime if docker else "",
        image=launch.image if launch else "",
        rootfs=launch.rootfs if launch else "",
        restore_from=archive.location,
    )
    handle = provider.create(spec)
    now = timezone.now()
    if not sandbox_transition(
        sandbox,
        SandboxState.RUNNING,
        where={"state": SandboxState.ARCHIVED},
        provider_id=handle.provider_id,
        engine=handle_engine(handle),
        started_at=now,
        stopped_at=None,
        paused_at=None,
        last_activity_at=now,
        expires_at=now + timedelta(seconds=settings.SANDPIT_MAX_LIFETIME_S),
    ):
        provider.destroy(handle.provider_id)  # destroyed meanwhile: do not leak it
        raise Conflict(f"Sandbox {sandbox.id} changed state meanwhile.", code="conflict")
    archive.delete()


# --- the reaper's archiving ------------------------------------------------------------------------


def sandbox_archive(sandbox: Sandbox) -> bool:
    """Snapshot a paused sandbox (kind 'archive'), destroy its provider resource and mark
    it archived. The platform's work: never refused, never counted. Returns whether it
    archived; a resume that wins the race keeps the sandbox (the snapshot is dropped)."""
    if sandbox.state != SandboxState.PAUSED:
        return False
    archive = _take(sandbox, kind=ARCHIVE)
    if not sandbox_transition(
        sandbox,
        SandboxState.ARCHIVED,
        where={"state": SandboxState.PAUSED, "paused_at": sandbox.paused_at},
        stopped_at=timezone.now(),
    ):
        archive.delete()
        return False
    try:
        provider_for(sandbox).destroy(sandbox.provider_id)
    except ProviderError:
        # The row is archived; the reconciler removes the leftover resource.
        logger.exception("destroying an archived sandbox's resource failed")
    terminals_close_for_sandbox(sandbox.id)
    sandbox_event_broadcast(sandbox.id, {"type": "status", "state": "archived"})
    return True


def paused_sandboxes_archive(*, now: datetime | None = None, limit: int = 100) -> list[str]:
    """Archive sandboxes paused for SANDPIT_PAUSED_ARCHIVE_AFTER_S or past their max
    lifetime (the reaper's step). Isolates failures per sandbox (logged; it stays paused
    and is tried again next run). Returns the ids archived."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.SANDPIT_PAUSED_ARCHIVE_AFTER_S)
    due = (
        Sandbox.objects.filter(state=SandboxState.PAUSED)
        .filter(Q(paused_at__lte=cutoff) | Q(expires_at__lte=now))
        .select_related("organization")
        .order_by("paused_at")[:limit]
    )
    archived = []
    for sandbox in due:
        try:
            if sandbox_archive(sandbox):
                archived.append(sandbox.id)
        except Exception:  # noqa: BLE001 - one sandbox's failure must not stop the run
            logger.exception("archiving paused sandbox %s failed", sandbox.id)
    return archived


def stale_snapshots_remove(*, now: datetime | None = None) -> int:
    """Delete snapshots left 'creating' longer than SANDPIT_CREATE_STALE_S (their taker died
    mid-way) with any partial file (the reaper's step). Returns how many went."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.SANDPIT_CREATE_STALE_S)
    deleted, _ = Snapshot.objects.filter(
        state=SnapshotState.CREATING, created_at__lte=cutoff
    ).delete()
    return deleted


def snapshots_describe_limits(organization: Organization) -> dict[str, Any]:
    """The organization's snapshot limits and use, for the API."""
    count, stored = snapshot_usage(organization)
    return {
        "snapshots": count,
        "max_snapshots": settings.SANDPIT_MAX_SNAPSHOTS_PER_ORG,
        "bytes": stored,
        "max_bytes": settings.SANDPIT_MAX_SNAPSHOT_BYTES_PER_ORG,
    }
