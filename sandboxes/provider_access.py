"""How every service reaches a sandbox's provider: the provider holding it, the capability
and running checks, the guarded call (a sandbox that vanished is marked error; outages are
counted) and the conditional state transition. Used by services.py and its siblings
(file_services, process_services, code_services, terminals, streaming, snapshots)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import cache
from typing import Any

from django.db import connection, transaction
from django.db.models import Field
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
        if where or not allowed_from or not _plain_values(fields):
            updated = Sandbox.objects.filter(
                pk=sandbox.pk, state__in=allowed_from, **dict(where or {})
            ).update(state=to, **fields)
        else:
            updated = _transition_update(sandbox.pk, to, allowed_from, fields)
    if updated:
        sandbox.state = to
        for name, value in fields.items():
            setattr(sandbox, name, value)
    return bool(updated)


def _plain_values(fields: Mapping[str, Any]) -> bool:
    """Whether every field is a plain column set to a value (no relation, no expression),
    which _transition_update writes as the ORM would."""
    columns = _columns()
    for name, value in fields.items():
        field = columns.get(name)
        if field is None or field.is_relation or hasattr(value, "resolve_expression"):
            return False
    return True


@cache
def _columns() -> dict[str, Field[Any, Any]]:
    return {field.name: field for field in Sandbox._meta.concrete_fields}


def _transition_update(pk: str, to: str, allowed_from: list[str], fields: Mapping[str, Any]) -> int:
    """The conditional UPDATE of sandbox_transition, by a statement written once per set of
    fields: the ORM compiled it on every call (a create's move to running cost ~1 ms of
    CPU). Values are prepared by their fields, as the ORM's update() prepares them."""
    names = tuple(fields)
    columns = _columns()
    values = [columns["state"].get_db_prep_save(to, connection)]
    values += [columns[name].get_db_prep_save(fields[name], connection) for name in names]
    with connection.cursor() as cursor:
        cursor.execute(
            _transition_sql(names, len(allowed_from)), [*values, pk, *map(str, allowed_from)]
        )
        return int(cursor.rowcount)


@cache
def _transition_sql(names: tuple[str, ...], allowed: int) -> str:
    quote = connection.ops.quote_name
    meta, columns = Sandbox._meta, _columns()
    sets = ", ".join(f"{quote(columns[name].column)} = %s" for name in ("state", *names))
    states = ", ".join(["%s"] * allowed)
    where = f"{quote(meta.pk.column)} = %s AND {quote(columns['state'].column)} IN ({states})"
    # Identifiers from the model, quoted; the values are parameters.
    return f"UPDATE {quote(meta.db_table)} SET {sets} WHERE {where}"  # noqa: S608


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
