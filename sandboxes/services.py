"""Sandbox side effects: lifecycle, commands, tokens and ports (files in file_services.py,
processes in process_services.py, code runs in code_services.py).

The one door: every operation that runs something in a sandbox is a function here (or in
a sibling module: file_services, process_services, code_services, terminals, streaming)
taking a `Caller`, and wraps its provider call in
`caller.metered` (scope, billing authorization, the call, one usage record). Interfaces
resolve tenancy with a selector, build the Caller and call one of these; they never reach a
provider or billing themselves.

Provider calls never run inside a database transaction: a command may take
30 s. Each service reads, calls the provider, then makes one short write.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from accounts.authentication import Principal
from accounts.models import Organization
from accounts.tokens import sandbox_token_encode
from common.dbconn import release_idle_connection
from common.errors import ApplicationError, Conflict, Forbidden, QuotaExceeded
from common.metrics import counter_inc
from common.rows import RowInsert

from .activity import ACTIVITY_WRITE_INTERVAL_S, sandbox_touch, sandbox_touch_id
from .caller import PLATFORM, Caller, billing_authorize, billing_record, metered
from .engines import engine_spec_labels, handle_engine
from .events import sandbox_event_broadcast
from .models import LIVE_STATES, Sandbox, SandboxState, Snapshot
from .provider_access import (
    FAST_COMMIT_SQL,
    fast_commit,
    keep_started_row,
    provider_call,
    provider_for,
    require_capability,
    require_running,
    sandbox_started,
    sandbox_transition,
    takes_several_statements,
)
from .providers import (
    configured_provider_names,
    get_provider,
    provider_isolation,
    resolve_provider_name,
)
from .providers.base import (
    Capability,
    CapabilityNotSupported,
    ExecRequest,
    ExecResult,
    ProviderError,
    Resources,
    SandboxGone,
    SandboxSpec,
    SandboxStats,
    WarmPooled,
    WarmReservation,
    WarmReserving,
)
from .row_cache import epoch_read_with
from .selectors import SANDBOX_WITH_ORGANIZATION
from .snapshot_store import archives_drop
from .templates import template_for_sandbox
from .terminal_registry import terminals_close_for_sandbox

__all__ = [  # re-exported: interfaces import the door from here
    "ACTIVITY_WRITE_INTERVAL_S",
    "PLATFORM",
    "Caller",
    "ProviderError",
    "sandbox_touch",
    "sandbox_touch_id",
]

logger = logging.getLogger(__name__)


# --- lifecycle ------------------------------------------------------------------------


CAPPED_STATES = (*LIVE_STATES, SandboxState.PAUSED)
"""States counted against the concurrent-sandboxes cap: a paused sandbox keeps its memory
and its provider resource, so it still takes a place; an archived one holds only a
snapshot, so it does not (resuming it takes a place again)."""


SANDBOX_INSERT = RowInsert(Sandbox)


def max_concurrent_sandboxes(organization: Organization) -> int:
    return organization.max_concurrent_sandboxes or settings.SANDPIT_MAX_CONCURRENT_SANDBOXES


def capped_sandboxes_lock_and_count(organization_id: int, *, prefix: str = "") -> int:
    """Lock the organization's row (inside the caller's transaction, so two creates cannot
    both pass the limit) and return how many of its sandboxes are in CAPPED_STATES.
    `prefix` (fast_commit's) goes before the first statement.

    Two statements: the count must be read after the lock is granted (a statement's
    snapshot is taken when it starts), so a create that waited sees the row the other one
    inserted. Sent in one round trip where the cursor allows it, still two statements."""
    lock_sql, count_sql = _capped_sql()
    count_params: list[int | str] = [organization_id, *map(str, CAPPED_STATES)]
    with connection.cursor() as cursor:
        if prefix or takes_several_statements(cursor):
            cursor.execute(f"{prefix}{lock_sql}; {count_sql}", [organization_id, *count_params])
            while cursor.nextset():  # to the count's result, the last one
                pass
        else:
            cursor.execute(lock_sql, [organization_id])
            cursor.execute(count_sql, count_params)
        (live,) = cursor.fetchone()
    return int(live)


def sandbox_insert_capped(
    sandbox: Sandbox, limit: int, principal: Principal | None = None
) -> int | None:
    """Insert `sandbox` unless its organization already has `limit` sandboxes in
    CAPPED_STATES: None once inserted, else how many it has (and nothing is inserted).
    A row inserted running for `principal`'s create is kept as sandbox_started keeps
    the row it moves to running (provider_access.keep_started_row).

    Two creates never both pass the limit: the organization's row is locked first and the
    count is read after the lock is granted. On PostgreSQL outside any transaction this is
    one round trip, not four (BEGIN, lock and count, insert, COMMIT): the lock, then the
    insert with the count as its condition (a later statement, so a later snapshot), in the
    implicit transaction of one query, committed as fast_commit commits. Elsewhere, a
    transaction of the lock and count, then the insert."""
    lock_sql, count_sql = _capped_sql()
    states = [str(state) for state in CAPPED_STATES]
    with connection.cursor() as cursor:
        alone = not connection.in_atomic_block and connection.get_autocommit()
        if alone and takes_several_statements(cursor) and not SANDBOX_INSERT.saves_through_orm():
            insert_sql = SANDBOX_INSERT.sql_where(f"({count_sql}) < %s")
            epoch = epoch_read_with(principal) if sandbox.state == SandboxState.RUNNING else None
            if epoch is not None:
                insert_sql = SANDBOX_WITH_ORGANIZATION.insert_sql(insert_sql)
            values = SANDBOX_INSERT.values(sandbox)
            cursor.execute(
                f"{FAST_COMMIT_SQL}; {lock_sql}; {insert_sql}",
                [sandbox.organization_id, *values, sandbox.organization_id, *states, limit],
            )
            while cursor.nextset():  # to the insert's result, the last one
                pass
            if cursor.rowcount == 1:
                SANDBOX_INSERT.saved(sandbox)
                if epoch is not None:
                    keep_started_row(sandbox, cursor.fetchone(), epoch)
                return None
            cursor.execute(count_sql, [sandbox.organization_id, *states])
            (live,) = cursor.fetchone()
            return max(int(live), limit)  # sandboxes destroyed since the insert's count
    with fast_commit(caller_sends_setting=True) as setting:
        live = capped_sandboxes_lock_and_count(sandbox.organization_id, prefix=setting)
        if live >= limit:
            return live
        SANDBOX_INSERT.insert(sandbox)
    return None


@cache
def _capped_sql() -> tuple[str, str]:
    """The statements of `select_for_update().filter(pk=...)` and `filter(organization=...,
    state__in=CAPPED_STATES).count()`, written once from the models: the ORM compiled both
    on every create (0.7 ms of its CPU). FOR UPDATE only where the database has it, as
    the ORM does (SQLite locks the whole database for a write anyway)."""
    quote = connection.ops.quote_name
    org, sandbox = Organization._meta, Sandbox._meta
    # Identifiers from the models, quoted; the values are parameters.
    lock = f"SELECT 1 FROM {quote(org.db_table)} WHERE {quote(org.pk.column)} = %s"  # noqa: S608
    if connection.features.has_select_for_update:
        lock += " FOR UPDATE"
    states = ", ".join(["%s"] * len(CAPPED_STATES))
    count = (
        f"SELECT COUNT(*) FROM {quote(sandbox.db_table)} "  # noqa: S608
        f"WHERE {quote(sandbox.get_field('organization').column)} = %s "
        f"AND {quote(sandbox.get_field('state').column)} IN ({states})"
    )
    return lock, count


def resources_from_request(requested: Mapping[str, Any] | None) -> Resources:
    """Clamp requested resources to the installation's ceilings."""
    requested = requested or {}
    defaults = Resources()
    return Resources(
        memory_mb=min(int(requested.get("memory_mb", defaults.memory_mb)), 8192),
        cpu_count=min(float(requested.get("cpu_count", defaults.cpu_count)), 4.0),
        pids=min(int(requested.get("pids", defaults.pids)), 1024),
        disk_mb=min(int(requested.get("disk_mb", defaults.disk_mb)), 10240),
    )


def _from_snapshot(
    snapshot: Snapshot, provider_name: str | None, resources: Mapping[str, Any] | None
) -> tuple[str, str, Mapping[str, Any] | None]:
    """(provider, template, resources) of a sandbox started from `snapshot`."""
    if snapshot.state != "ready":
        raise Conflict(f"Snapshot {snapshot.id} is {snapshot.state}.", code="snapshot_not_ready")
    if provider_name and resolve_provider_name(provider_name) != snapshot.provider:
        raise Conflict(
            f"Snapshot {snapshot.id} was taken on the '{snapshot.provider}' provider and can "
            'only start sandboxes there: leave out "provider" or ask for that one.',
            code="snapshot_provider_mismatch",
        )
    source = snapshot.sandbox.resources if snapshot.sandbox is not None else {}
    return snapshot.provider, snapshot.template, {**(source or {}), **(resources or {})}


def sandbox_create(
    *,
    principal: Principal,
    provider_name: str | None = None,
    template: str = "default",
    timeout_s: int | None = None,
    network: bool = False,
    resources: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    metadata: Mapping[str, Any] | None = None,
    ephemeral: bool = False,
    caller: Caller | None = None,
    snapshot: Snapshot | None = None,
) -> Sandbox:
    """Create a sandbox row and the provider resource, counted once (feature 'sandbox') on
    `caller`'s account (default: the principal's). Raises PaymentRequired (402), QuotaExceeded
    (429) past the organization's concurrent limit, Forbidden when network is asked for but
    not allowed.

    `snapshot` (already resolved for the organization): start with its files, on its
    provider and template, with the resources of the sandbox it was taken from unless
    given; Conflict 'snapshot_not_ready' or 'snapshot_provider_mismatch'."""
    caller = caller or Caller(principal)
    # The one door's order (authorize, create, record), spelled out rather than wrapped so
    # the body keeps its shape.
    billing_authorize(caller, "sandbox")
    if snapshot is not None:
        provider_name, template, resources = _from_snapshot(snapshot, provider_name, resources)
    organization = principal.organization
    # 400 for a provider not enabled here, whichever entry point named it.
    provider = get_provider(provider_name_check(provider_name))
    # 400 for an unknown template, 409 for one not built: never a silent default.
    launch = template_for_sandbox(
        organization=organization, name=template, provider_name=provider.name
    )
    if network and not organization.allow_network:
        raise Forbidden(
            "This organization does not allow outbound network for its sandboxes (off by "
            "default). An owner can allow it on the Team page or with PATCH "
            '/api/v1/organization {"allow_network": true}; or create the sandbox without '
            '"network": true.',
            code="network_not_allowed",
        )
    if network and Capability.NETWORK not in provider.capabilities:
        raise CapabilityNotSupported(
            f"The '{provider.name}' provider cannot give sandboxes outbound network on this "
            "installation (for local: slirp4netns, nsenter and nft on the host). Choose a "
            "provider listing the 'network' capability in GET /api/v1/providers, or create "
            'the sandbox without "network": true.'
        )
    runtime = organization.docker_runtime if provider.name == "docker" else ""
    if organization.docker_runtime == "runsc" and provider.name != "docker":
        raise Forbidden(
            "This organization requires gVisor isolation: use the docker provider. An owner "
            "can change this on the Team page or with PATCH /api/v1/organization "
            '{"docker_runtime": ""}.',
            code="gvisor_required",
        )
    resolved = resources_from_request(resources)
    now = timezone.now()
    limit = max_concurrent_sandboxes(organization)
    sandbox = Sandbox(
        organization=organization,
        created_by=principal.user,
        created_by_key=principal.api_key,
        provider=provider.name,
        template=template,
        resources=resolved.__dict__,
        timeout_s=timeout_s or settings.SANDPIT_IDLE_TIMEOUT_S,
        network=network,
        isolation=provider_isolation(provider, runtime),
        metadata=dict(metadata or {}),
        ephemeral=ephemeral,
        expires_at=now + timedelta(seconds=settings.SANDPIT_MAX_LIFETIME_S),
        snapshot=snapshot,
    )
    spec = SandboxSpec(
        sandbox_id=sandbox.id,
        template=template,
        timeout_s=sandbox.timeout_s,
        lifetime_s=settings.SANDPIT_MAX_LIFETIME_S,
        network=network,
        resources=resolved,
        env=dict(env or {}),
        labels={
            "sandpit.org": str(organization.pk),
            **(engine_spec_labels(organization, template) if provider.name == "docker" else {}),
        },
        runtime=runtime,
        image=launch.image if launch else "",
        rootfs=launch.rootfs if launch else "",
        restore_from=snapshot.location if snapshot is not None else "",
    )
    reserved = provider.warm_reserve(spec) if isinstance(provider, WarmReserving) else None
    if reserved is not None:
        _create_reserved(sandbox, limit, principal, reserved)
    else:
        _refuse_past_limit(sandbox_insert_capped(sandbox, limit), limit)
        release_idle_connection()  # not held while the sandbox starts (common/dbconn.py)
        try:
            handle = provider.create(spec)
        except ProviderError as exc:
            sandbox_transition(sandbox, SandboxState.ERROR, error_message=exc.message)
            raise
        started = timezone.now()
        if not sandbox_started(
            sandbox,
            principal,
            provider_id=handle.provider_id,
            engine=handle_engine(handle),
            started_at=started,
            last_activity_at=started,
        ):
            # Destroyed while we were creating it: do not leak the resource.
            provider.destroy(handle.provider_id)
    logger.info("sandbox created", extra={"sandbox_id": sandbox.id})
    billing_record(caller, "sandbox.create")
    return sandbox


def _refuse_past_limit(live: int | None, limit: int) -> None:
    """QuotaExceeded when sandbox_insert_capped refused the row (`live` is not None)."""
    if live is not None:
        raise QuotaExceeded(
            f"This organization already has {live} live sandboxes (limit {limit}). "
            "Destroy one or ask an operator to raise the limit.",
            code="sandbox_limit_reached",
        )


def _create_reserved(
    sandbox: Sandbox, limit: int, principal: Principal, reserved: WarmReservation
) -> None:
    """The create of a sandbox on a warm one set aside for it: the row goes in already
    running (one write instead of an insert and a move to running: a round trip to the
    database fewer), and a refused row gives the warm sandbox back unused."""
    now = timezone.now()
    sandbox.state = SandboxState.RUNNING
    sandbox.provider_id = reserved.provider_id
    sandbox.engine = reserved.engine
    sandbox.started_at = sandbox.last_activity_at = now
    try:
        _refuse_past_limit(sandbox_insert_capped(sandbox, limit, principal), limit)
    except BaseException:
        reserved.release()
        raise
    release_idle_connection()  # not held while the sandbox starts (common/dbconn.py)
    try:
        reserved.adopt()
    except SandboxGone:
        # Destroyed between the insert and the adoption (the row was listed as running):
        # the destroy ended the sandbox, and nothing was left running; say what it is now.
        sandbox.refresh_from_db()
    except ProviderError as exc:
        sandbox_transition(sandbox, SandboxState.ERROR, error_message=exc.message)
        raise


def sandbox_destroy(
    *,
    sandbox: Sandbox,
    reason: str = "api",
    only_if_idle: bool = False,
    caller: Caller = PLATFORM,
) -> bool:
    """Destroy in the provider and record why. Only the caller that wins the state change
    calls the provider, so concurrent destroys never double-destroy. With `only_if_idle`
    (the reaper), it wins only if the sandbox is still running with the activity time and
    timeout the caller read: a keystroke in between keeps it alive. Returns whether it won.

    Never refused by billing (stopping); a user's destroy is counted once while billing
    would allow it. The default caller is the platform (reaper, reconciler): not counted."""
    with metered(caller, feature="sandbox", operation="sandbox.destroy", teardown=True):
        return _destroy(sandbox, reason=reason, only_if_idle=only_if_idle)


def _destroy(sandbox: Sandbox, *, reason: str, only_if_idle: bool) -> bool:
    where = (
        {
            "state": SandboxState.RUNNING,
            "last_activity_at": sandbox.last_activity_at,
            "timeout_s": sandbox.timeout_s,
        }
        if only_if_idle
        else None
    )
    if not sandbox_transition(
        sandbox,
        SandboxState.DESTROYED,
        where=where,
        destroyed_at=timezone.now(),
        destroy_reason=reason,
    ):
        return False
    if sandbox.provider_id:
        release_idle_connection()
        try:
            provider_for(sandbox).destroy(sandbox.provider_id)
        except ProviderError:
            # The row is destroyed; the reconciler removes the leftover resource.
            counter_inc("provider_errors", provider=sandbox.provider, operation="destroy")
            logger.exception("provider destroy failed", extra={"sandbox_id": sandbox.id})
    terminals_close_for_sandbox(sandbox.id)
    archives_drop(sandbox)  # nothing will resume from the reaper's snapshots of it now
    sandbox_event_broadcast(sandbox.id, {"type": "status", "state": "destroyed", "reason": reason})
    logger.info("sandbox destroyed (%s)", reason, extra={"sandbox_id": sandbox.id})
    return True


def sandbox_set_timeout(*, caller: Caller, sandbox: Sandbox, timeout_s: int) -> Sandbox:
    """Set the idle timeout and count as activity (keep-alive); counted once.

    The idle timeout is the reaper's on every provider. A provider with its own kill timer
    keeps it at the sandbox's end of life (expires_at), renewed here: never the idle
    timeout, which would end a sandbox in use when that timer ran out."""
    with metered(caller, feature="sandbox", operation="sandbox.timeout"):
        require_running(sandbox)
        provider = provider_for(sandbox)
        now = timezone.now()
        if Capability.TIMEOUT in provider.capabilities:
            remaining_s = max(1, int((sandbox.expires_at - now).total_seconds()))
            provider_call(sandbox, provider.set_timeout, sandbox.provider_id, remaining_s)
        Sandbox.objects.update_row(sandbox.pk, timeout_s=timeout_s, last_activity_at=now)
        sandbox.timeout_s, sandbox.last_activity_at = timeout_s, now
    return sandbox


def sandbox_stats(*, sandbox: Sandbox) -> SandboxStats:
    """Resource gauges. Not counted: monitoring reads Sandpit's view of the sandbox and runs
    nothing in it, and an open playground polls it every few seconds."""
    require_running(sandbox)
    provider = provider_for(sandbox)
    require_capability(provider, Capability.STATS)
    return provider_call(sandbox, provider.stats, sandbox.provider_id)


# --- execution ---------------------------------------------------------------------------


def sandbox_exec(
    *,
    caller: Caller,
    sandbox: Sandbox,
    command: str,
    args: Sequence[str] | None = None,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
    stdin: bytes | None = None,
) -> ExecResult:
    """Run one command to completion, counted once. `args is None` → `sh -c command`."""
    with metered(caller, feature="exec", operation="command", scope="exec"):
        require_running(sandbox)
        provider = provider_for(sandbox)
        require_capability(provider, Capability.EXEC)
        request = ExecRequest(
            command=command,
            args=list(args) if args is not None else None,
            cwd=cwd,
            env=dict(env or {}),
            timeout_s=min(timeout_s or 30.0, settings.SANDPIT_MAX_COMMAND_TIMEOUT_S),
            stdin=stdin,
            max_output_bytes=settings.SANDPIT_MAX_OUTPUT_BYTES,
        )
        result = provider_call(sandbox, provider.exec, sandbox.provider_id, request)
    sandbox_touch(sandbox)
    return result


# --- tokens, ports, providers ------------------------------------------------------------------


def sandbox_token_mint(
    *, caller: Caller, sandbox: Sandbox, scopes: Sequence[str], ttl_s: int
) -> tuple[str, datetime]:
    """A sandbox token for `sandbox` with `scopes`, valid `ttl_s` seconds (counted once).
    Returns (token, expires_at)."""
    principal = caller.principal
    if principal is None or principal.token is not None:
        raise Forbidden("Sandbox tokens cannot do this; use an API key.", code="token_not_allowed")
    with metered(caller, feature="tokens", operation="token.mint"):
        token, expires_at = sandbox_token_encode(
            sandbox_id=sandbox.id,
            organization_id=principal.organization.pk,
            scopes=list(scopes),
            ttl_s=ttl_s,
            api_key_id=principal.api_key.pk if principal.api_key else None,
            user_id=principal.user.pk if principal.user else None,
        )
    return token, datetime.fromtimestamp(expires_at, tz=UTC)


def sandbox_ports_list(*, caller: Caller, sandbox: Sandbox) -> list[tuple[int, str]]:
    """Listening TCP ports in the sandbox as sorted (port, address), one per port (counted
    once; empty when the sandbox is not running)."""
    with metered(caller, feature="ports", operation="ports.list", scope="ports"):
        provider = provider_for(sandbox)
        require_capability(provider, Capability.PORTS)
        if sandbox.state != SandboxState.RUNNING:
            return []
        seen: dict[int, str] = {}
        for open_port in provider.open_ports(sandbox.provider_id):
            seen.setdefault(open_port.port, open_port.address)
    return sorted(seen.items())


def provider_name_check(name: str | None) -> str:
    """The canonical name of an enabled provider (default when None); ApplicationError
    'unknown_provider' (400) otherwise."""
    provider_name = resolve_provider_name(name or settings.SANDPIT_DEFAULT_PROVIDER)
    if provider_name not in configured_provider_names():
        raise ApplicationError(
            f"Unknown or disabled provider '{provider_name}'. Enabled: "
            f"{', '.join(configured_provider_names())}.",
            code="unknown_provider",
        )
    return provider_name


def providers_describe(organization: Organization) -> list[dict[str, Any]]:
    """Each enabled provider: name, default, capabilities, a live health check and the
    limits that apply to `organization`. Not counted (runs nothing in a sandbox)."""
    providers = []
    for name in configured_provider_names():
        entry: dict[str, Any] = {"name": name, "default": name == settings.SANDPIT_DEFAULT_PROVIDER}
        try:
            provider = get_provider(name)
            health = provider.health()
            runtime = organization.docker_runtime if provider.name == "docker" else ""
            names = {c.value for c in provider.capabilities}
            if Capability.EXEC in provider.capabilities:  # code_services builds /code on exec
                names.add("run_code")
            entry.update(
                isolation=provider_isolation(provider, runtime),
                capabilities=sorted(names),
                health={
                    "ok": health.ok,
                    "detail": health.detail,
                    "latency_ms": round(health.latency_ms, 2),
                },
            )
        except ProviderError as exc:
            entry.update(capabilities=[], health={"ok": False, "detail": exc.message})
        entry["limits"] = {
            "max_concurrent_sandboxes": max_concurrent_sandboxes(organization),
            "max_command_timeout_s": settings.SANDPIT_MAX_COMMAND_TIMEOUT_S,
            "max_file_bytes": settings.SANDPIT_MAX_FILE_BYTES,
            "max_output_bytes": settings.SANDPIT_MAX_OUTPUT_BYTES,
        }
        providers.append(entry)
    return providers


POOLED_PROVIDERS = ("local", "docker")
"""Providers that keep warm pools (pre-started jails or containers) in each web process;
built here, not the cloud ones (their construction may call out)."""


def providers_prepare() -> list[str]:
    """Build the enabled providers that keep warm pools and start filling them, so each
    web process's pools fill while it waits for its first request rather than during it:
    with several processes on one port, a burst's connections spread over all of them, and
    a process that had served nothing yet started every one of its creates cold. Returns
    the names built; one that cannot be built now (an engine down) is logged and left to
    the first create, which reports why."""
    built = []
    for name in configured_provider_names():
        if name not in POOLED_PROVIDERS:
            continue
        try:
            provider = get_provider(name)
        except ProviderError as exc:
            logger.warning("provider %s not prepared: %s", name, exc.message)
            continue
        if isinstance(provider, WarmPooled):
            provider.warm_pool_start()
        built.append(name)
    return built
