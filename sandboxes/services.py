"""Sandbox side effects: lifecycle, commands, code, files, processes, tokens and ports.

The one door: every operation that runs something in a sandbox is a function here (or in
terminals.py / streaming.py) taking a `Caller`, and wraps its provider call in
`caller.metered` (scope, billing authorization, the call, one usage record). Interfaces
resolve tenancy with a selector, build the Caller and call one of these; they never reach a
provider or billing themselves.

Provider calls never run inside a database transaction: a command may take
30 s. Each service reads, calls the provider, then makes one short write.
"""

from __future__ import annotations

import logging
import shlex
import signal as signal_module
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from accounts.authentication import Principal
from accounts.models import Organization
from accounts.tokens import sandbox_token_encode
from common.dbconn import release_idle_connection
from common.errors import ApplicationError, Conflict, Forbidden, QuotaExceeded
from common.metrics import counter_inc

from .activity import ACTIVITY_WRITE_INTERVAL_S, sandbox_touch, sandbox_touch_id
from .caller import PLATFORM, Caller, billing_authorize, billing_record, metered
from .engines import engine_spec_labels, handle_engine
from .events import sandbox_event_broadcast
from .models import ALLOWED_TRANSITIONS, LIVE_STATES, Sandbox, SandboxState, Snapshot
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
    FileEntry,
    ProcessInfo,
    ProcessNotFound,
    ProviderError,
    ProviderUnavailable,
    Resources,
    SandboxGone,
    SandboxProvider,
    SandboxSpec,
    SandboxStats,
)
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


# --- helpers ------------------------------------------------------------------------


def provider_for(sandbox: Sandbox) -> SandboxProvider:
    """The provider holding the sandbox (ProviderError when it is not configured)."""
    return get_provider(sandbox.provider)


def require_capability(provider: SandboxProvider, capability: Capability) -> None:
    if capability not in provider.capabilities:
        raise CapabilityNotSupported(
            f"The '{provider.name}' provider does not support {capability.value}."
        )


@contextmanager
def fast_commit() -> Iterator[None]:
    """A transaction whose COMMIT does not wait for the WAL flush (PostgreSQL).

    For sandbox bookkeeping only, never for money: a database crash may lose the last few
    milliseconds of state changes, and the reconciler repairs exactly that (a resource with
    no live row is destroyed, a live row with no resource becomes error). Saves an fsync
    (1-2 ms here) on every create and destroy."""
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL synchronous_commit TO OFF")
        yield


def sandbox_transition(
    sandbox: Sandbox, to: str, *, where: Mapping[str, Any] | None = None, **fields: Any
) -> bool:
    """Move to state `to` if the current state allows it (and the row still matches `where`).
    Conditional UPDATE, so two workers racing on one sandbox cannot both win. Returns
    whether this call won."""
    allowed_from = [state for state, targets in ALLOWED_TRANSITIONS.items() if to in targets]
    with fast_commit():
        updated = Sandbox.objects.filter(
            pk=sandbox.pk, state__in=allowed_from, **dict(where or {})
        ).update(state=to, **fields)
    if updated:
        sandbox.state = to
        for name, value in fields.items():
            setattr(sandbox, name, value)
    return bool(updated)


def _require_running(sandbox: Sandbox) -> None:
    if sandbox.state in (SandboxState.PAUSED, SandboxState.ARCHIVED):
        # Never resumed behind the caller's back: resuming is counted and may restart it.
        raise Conflict(
            f"Sandbox {sandbox.id} is {sandbox.state}: resume it first "
            f"(POST /api/v1/sandboxes/{sandbox.id}/resume).",
            code="sandbox_paused",
        )
    if sandbox.state != SandboxState.RUNNING:
        raise Conflict(
            f"Sandbox {sandbox.id} is {sandbox.state}, not running.", code="sandbox_not_running"
        )


def _call(sandbox: Sandbox, fn, *args: Any, **kwargs: Any) -> Any:  # type: ignore[no-untyped-def]
    """Call the provider; a sandbox that vanished under us is marked error. Provider
    outages are counted for /metrics; user-caused errors (missing file...) are not."""
    release_idle_connection()  # not held while the provider works (common/dbconn.py)
    try:
        return fn(*args, **kwargs)
    except (SandboxGone, ProviderUnavailable) as exc:
        operation = getattr(fn, "__name__", "unknown")
        counter_inc("provider_errors", provider=sandbox.provider, operation=operation)
        if isinstance(exc, SandboxGone):
            sandbox_transition(
                sandbox,
                SandboxState.ERROR,
                error_message="The provider no longer has this sandbox.",
                stopped_at=timezone.now(),
            )
        raise


# --- lifecycle ------------------------------------------------------------------------


CAPPED_STATES = (*LIVE_STATES, SandboxState.PAUSED)
"""States counted against the concurrent-sandboxes cap: a paused sandbox keeps its memory
and its provider resource, so it still takes a place; an archived one holds only a
snapshot, so it does not (resuming it takes a place again)."""


def max_concurrent_sandboxes(organization: Organization) -> int:
    return organization.max_concurrent_sandboxes or settings.SANDPIT_MAX_CONCURRENT_SANDBOXES


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
    provider = get_provider(provider_name or settings.SANDPIT_DEFAULT_PROVIDER)
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
    with fast_commit():
        # Lock the organization row briefly so two creates cannot both pass the limit.
        Organization.objects.select_for_update().filter(pk=organization.pk).first()
        live = Sandbox.objects.filter(organization=organization, state__in=CAPPED_STATES).count()
        if live >= limit:
            raise QuotaExceeded(
                f"This organization already has {live} live sandboxes (limit {limit}). "
                "Destroy one or ask an operator to raise the limit.",
                code="sandbox_limit_reached",
            )
        sandbox = Sandbox.objects.create(
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
    release_idle_connection()  # not held while the sandbox starts (common/dbconn.py)
    try:
        handle = provider.create(spec)
    except ProviderError as exc:
        sandbox_transition(sandbox, SandboxState.ERROR, error_message=exc.message)
        raise
    started = timezone.now()
    if not sandbox_transition(
        sandbox,
        SandboxState.RUNNING,
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
        _require_running(sandbox)
        provider = provider_for(sandbox)
        now = timezone.now()
        if Capability.TIMEOUT in provider.capabilities:
            remaining_s = max(1, int((sandbox.expires_at - now).total_seconds()))
            _call(sandbox, provider.set_timeout, sandbox.provider_id, remaining_s)
        Sandbox.objects.filter(pk=sandbox.pk).update(timeout_s=timeout_s, last_activity_at=now)
        sandbox.timeout_s, sandbox.last_activity_at = timeout_s, now
    return sandbox


def sandbox_stats(*, sandbox: Sandbox) -> SandboxStats:
    """Resource gauges. Not counted: monitoring reads Sandpit's view of the sandbox and runs
    nothing in it, and an open playground polls it every few seconds."""
    _require_running(sandbox)
    provider = provider_for(sandbox)
    require_capability(provider, Capability.STATS)
    return _call(sandbox, provider.stats, sandbox.provider_id)


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
        _require_running(sandbox)
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
        result = _call(sandbox, provider.exec, sandbox.provider_id, request)
    sandbox_touch(sandbox)
    return result


# --- files -----------------------------------------------------------------------------------


def _files(sandbox: Sandbox) -> SandboxProvider:
    _require_running(sandbox)
    provider = provider_for(sandbox)
    require_capability(provider, Capability.FILES)
    return provider


def _file_op(caller: Caller, operation: str) -> Any:
    return metered(caller, feature="files", operation=operation, scope="files")


def sandbox_file_list(
    *, caller: Caller, sandbox: Sandbox, path: str, recursive: bool = False
) -> list[FileEntry]:
    """Entries under `path` (counted once)."""
    with _file_op(caller, "files.list"):
        provider = _files(sandbox)
        entries = _call(sandbox, provider.list_files, sandbox.provider_id, path, recursive)
    sandbox_touch(sandbox)
    return entries


def sandbox_file_read(
    *, caller: Caller, sandbox: Sandbox, path: str, offset: int = 0, length: int | None = None
) -> bytes:
    """`length` bytes (all when None) of a file from byte `offset` (counted once)."""
    with _file_op(caller, "files.read"):
        provider = _files(sandbox)
        data = _call(sandbox, provider.read_file, sandbox.provider_id, path, offset, length)
    sandbox_touch(sandbox)
    return data


def sandbox_file_write(*, caller: Caller, sandbox: Sandbox, path: str, data: bytes) -> FileEntry:
    """Create or replace a file (counted once)."""
    with _file_op(caller, "files.write"):
        provider = _files(sandbox)
        entry = _call(sandbox, provider.write_file, sandbox.provider_id, path, data)
    sandbox_touch(sandbox)
    return entry


def sandbox_file_stat(*, caller: Caller, sandbox: Sandbox, path: str) -> FileEntry:
    """One entry's metadata (counted once)."""
    with _file_op(caller, "files.stat"):
        provider = _files(sandbox)
        entry = _call(sandbox, provider.stat, sandbox.provider_id, path)
    sandbox_touch(sandbox)
    return entry


def sandbox_file_exists(*, caller: Caller, sandbox: Sandbox, path: str) -> bool:
    """Whether anything (a file, a directory, a symlink, even a dangling one) is at `path`;
    counted once, like a stat. A path that would leave the sandbox is PathNotAllowed, not
    False: the answer must not probe outside."""
    with _file_op(caller, "files.exists"):
        provider = _files(sandbox)
        found = _call(sandbox, provider.exists, sandbox.provider_id, path)
    sandbox_touch(sandbox)
    return bool(found)


def sandbox_mkdir(*, caller: Caller, sandbox: Sandbox, path: str) -> FileEntry:
    """Create a directory and its parents (counted once)."""
    with _file_op(caller, "files.mkdir"):
        provider = _files(sandbox)
        entry = _call(sandbox, provider.mkdir, sandbox.provider_id, path)
    sandbox_touch(sandbox)
    return entry


def sandbox_file_move(*, caller: Caller, sandbox: Sandbox, src: str, dst: str) -> FileEntry:
    """Rename `src` to `dst` (counted once)."""
    with _file_op(caller, "files.move"):
        provider = _files(sandbox)
        entry = _call(sandbox, provider.move, sandbox.provider_id, src, dst)
    sandbox_touch(sandbox)
    return entry


def sandbox_file_remove(
    *, caller: Caller, sandbox: Sandbox, path: str, recursive: bool = False
) -> None:
    """Remove a file, or a directory with `recursive` (counted once)."""
    with _file_op(caller, "files.remove"):
        provider = _files(sandbox)
        _call(sandbox, provider.remove, sandbox.provider_id, path, recursive)
    sandbox_touch(sandbox)


# --- processes -----------------------------------------------------------------------------


def _processes(sandbox: Sandbox) -> SandboxProvider:
    _require_running(sandbox)
    provider = provider_for(sandbox)
    require_capability(provider, Capability.PROCESSES)
    return provider


def sandbox_process_start(
    *,
    caller: Caller,
    sandbox: Sandbox,
    command: str,
    args: Sequence[str] | None = None,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
) -> ProcessInfo:
    """Start a background process (counted once)."""
    with metered(caller, feature="processes", operation="process.start", scope="exec"):
        provider = _processes(sandbox)
        info = _call(
            sandbox,
            provider.start_process,
            sandbox.provider_id,
            command,
            list(args) if args is not None else None,
            cwd,
            dict(env or {}),
        )
    sandbox_touch(sandbox)
    return info


def sandbox_process_list(*, caller: Caller, sandbox: Sandbox) -> list[ProcessInfo]:
    """The sandbox's processes (counted once: it runs a listing inside the sandbox)."""
    with metered(caller, feature="processes", operation="process.list", scope="exec"):
        provider = _processes(sandbox)
        processes = _call(sandbox, provider.list_processes, sandbox.provider_id)
    return [replace(p, command=_shown_command(p.command)) for p in processes]


# --- background commands ---------------------------------------------------------------------

BACKGROUND_LOG_DIR = "/tmp/.sandpit/processes"
"""Where a background command's stdout and stderr go, as <pid>.out and <pid>.err. The
providers' agents discard a started process's output, so the command redirects its own:
`$$` is the shell's pid, which `exec` hands on to the program, so the file names match the
pid the API returns. In /tmp, not the workspace, so listings and watchers never see them."""
_LOG_PREFIX = (
    f"mkdir -p {BACKGROUND_LOG_DIR} && "
    f"exec >{BACKGROUND_LOG_DIR}/$$.out 2>{BACKGROUND_LOG_DIR}/$$.err </dev/null\n"
)
_READ_LOGS = (
    f'd={BACKGROUND_LOG_DIR}; [ -e "$d/$1.out" ] || exit 3; '
    'tail -c +"$(($2 + 1))" "$d/$1.out" | head -c "$4"; '
    'tail -c +"$(($3 + 1))" "$d/$1.err" 2>/dev/null | head -c "$4" >&2'
)


def _shown_command(command: str) -> str:
    """A background command as its caller wrote it (without the output redirection)."""
    if not command.startswith(_LOG_PREFIX):
        return command
    shown = command[len(_LOG_PREFIX) :]
    return shown[len("exec ") :] if shown.startswith("exec ") else shown


def sandbox_exec_background(
    *,
    caller: Caller,
    sandbox: Sandbox,
    command: str,
    args: Sequence[str] | None = None,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
) -> ProcessInfo:
    """Start a command in the background and return at once (counted once, as a command).
    Its stdout and stderr are kept in the sandbox (BACKGROUND_LOG_DIR) for
    `sandbox_background_output`; it runs until it exits, is signalled or the sandbox ends.
    `args is None` runs `command` under `sh -c`."""
    body = command if args is None else "exec " + shlex.join([command, *args])
    with metered(caller, feature="exec", operation="command", scope="exec"):
        provider = _processes(sandbox)
        info = _call(
            sandbox,
            provider.start_process,
            sandbox.provider_id,
            _LOG_PREFIX + body,
            None,
            cwd,
            dict(env or {}),
        )
    sandbox_touch(sandbox)
    return replace(info, command=_shown_command(info.command))


@dataclass(frozen=True)
class BackgroundOutput:
    """What a background command wrote since the offsets asked for."""

    stdout: bytes
    stderr: bytes
    process: ProcessInfo | None
    """Its state (running, exit code) when the sandbox still lists it."""


def sandbox_background_output(
    *,
    caller: Caller,
    sandbox: Sandbox,
    pid: int,
    stdout_offset: int = 0,
    stderr_offset: int = 0,
) -> BackgroundOutput:
    """Up to SANDPIT_MAX_OUTPUT_BYTES per stream of a background command's output, from
    the given byte offsets (a poller passes what it has read so far); counted once. Raises
    ProcessNotFound when `pid` was not started as a background command."""
    limit = settings.SANDPIT_MAX_OUTPUT_BYTES
    with metered(caller, feature="processes", operation="process.output", scope="exec"):
        provider = _processes(sandbox)
        # State first, output second: an answer saying it has exited then holds all it wrote.
        processes = _call(sandbox, provider.list_processes, sandbox.provider_id)
        request = ExecRequest(
            command="/bin/sh",
            args=[
                "-c",
                _READ_LOGS,
                "sh",
                str(pid),
                str(stdout_offset),
                str(stderr_offset),
                str(limit),
            ],
            timeout_s=30.0,
            max_output_bytes=limit,
        )
        result = _call(sandbox, provider.exec, sandbox.provider_id, request)
        found = next((p for p in processes if p.pid == pid), None)
        ours = found is not None and found.command.startswith(_LOG_PREFIX)
        if result.exit_code == 3 and not ours:
            raise ProcessNotFound(f"No background command with pid {pid} kept its output.")
    if found is not None:
        found = replace(found, command=_shown_command(found.command))
    if result.exit_code == 3:
        # Just started: its shell has not opened the log yet, so nothing was written.
        return BackgroundOutput(stdout=b"", stderr=b"", process=found)
    return BackgroundOutput(stdout=result.stdout, stderr=result.stderr, process=found)


def parse_signal(name: str | int) -> int:
    """A signal number from a name ('TERM', 'SIGTERM') or number; ApplicationError (400)."""
    if isinstance(name, int):
        number = name
    else:
        text = name.upper().strip()
        if text.isdigit():
            number = int(text)
        else:
            if not text.startswith("SIG"):
                text = "SIG" + text
            member = getattr(signal_module.Signals, text, None)
            if member is None:
                raise ApplicationError(f"Unknown signal '{name}'.", code="validation_error")
            number = int(member)
    if number not in {int(s) for s in signal_module.Signals}:
        raise ApplicationError(f"Unknown signal '{name}'.", code="validation_error")
    return number


def sandbox_process_signal(
    *, caller: Caller, sandbox: Sandbox, pid: int, signal: str | int
) -> None:
    """Send a signal to a process (counted once). Only SIGKILL stops a process whatever it
    does, so only SIGKILL is never refused by billing: a catchable signal could be a trigger
    for more work, so it stays an ordinary metered operation."""
    number = parse_signal(signal)
    with metered(
        caller,
        feature="processes",
        operation="process.signal",
        scope="exec",
        teardown=number == signal_module.SIGKILL,
    ):
        provider = _processes(sandbox)
        _call(sandbox, provider.signal_process, sandbox.provider_id, pid, number)
    sandbox_touch(sandbox)


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
