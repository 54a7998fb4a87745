"""How every service reaches a sandbox's provider: the provider holding it, the capability
and running checks, the guarded call (a sandbox that vanished is marked error; outages are
counted) and the conditional state transition. Used by services.py and its siblings
(file_services, process_services, code_services, terminals, streaming, snapshots)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from common.dbconn import release_idle_connection
from common.errors import Conflict
from common.metrics import counter_inc

from .models import ALLOWED_TRANSITIONS, Sandbox, SandboxState
from .providers import get_provider
from .providers.base import (
    Capability,
    CapabilityNotSupported,
    ProviderUnavailable,
    SandboxGone,
    SandboxProvider,
)


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


def require_running(sandbox: Sandbox) -> None:
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


def provider_call(sandbox: Sandbox, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
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
