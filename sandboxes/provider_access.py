"""How every service reaches a sandbox's provider: the provider holding it, the capability
and running checks, the guarded call (a sandbox that vanished is marked error; outages are
counted) and the conditional state transition. Used by services.py and its siblings
(file_services, process_services, code_services, terminals, streaming, snapshots)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import cache
from typing import Any, TypeVar

import psycopg
from django.db import connection, transaction
from django.db.models import Field
from django.utils import timezone

from accounts.principal import Principal
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
from .row_cache import NEVER_KEPT_STATE, epoch_read_with, keep_created, rows_changed
from .selectors import SANDBOX_BY_ID_AND_ORGANIZATION, SANDBOX_WITH_ORGANIZATION

T = TypeVar("T")


def provider_for(sandbox: Sandbox) -> SandboxProvider:
    """The provider holding the sandbox (ProviderError when it is not configured)."""
    return get_provider(sandbox.provider)


def require_capability(provider: SandboxProvider, capability: Capability) -> None:
    if capability not in provider.capabilities:
        raise CapabilityNotSupported(
            f"The '{provider.name}' provider does not support {capability.value}."
        )


FAST_COMMIT_SQL = "SET LOCAL synchronous_commit TO OFF"


@contextmanager
def fast_commit(*, caller_sends_setting: bool = False) -> Iterator[str]:
    """A transaction whose COMMIT does not wait for the WAL flush (PostgreSQL).

    For sandbox bookkeeping only, never for money: a database crash may lose the last few
    milliseconds of state changes, and the reconciler repairs exactly that (a resource with
    no live row is destroyed, a live row with no resource becomes error). Saves an fsync
    (1-2 ms here) on every create and destroy.

    Yields what the caller's first statement must begin with: with `caller_sends_setting`,
    on a cursor that takes several statements in one execute, the setting itself (so it
    rides in that statement's round trip); otherwise "" (it was sent here)."""
    with transaction.atomic():
        prefix = ""
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                if caller_sends_setting and takes_several_statements(cursor):
                    prefix = f"{FAST_COMMIT_SQL}; "
                else:
                    cursor.execute(FAST_COMMIT_SQL)
        yield prefix


def takes_several_statements(cursor: Any) -> bool:
    """Whether one execute on this PostgreSQL cursor may hold several statements: it binds
    parameters on the client (Django's default), so the text is sent as one simple query.
    Each statement still gets its own snapshot; each round trip saved is one fewer wait."""
    return connection.vendor == "postgresql" and isinstance(
        getattr(cursor, "cursor", None), psycopg.ClientCursor
    )


def fast_statement(sql: str, params: Sequence[Any]) -> int:
    """Run one write statement in a transaction of its own, committed as fast_commit does;
    returns its row count. Outside any transaction on PostgreSQL this is one round trip
    (the setting, the statement and its implicit transaction's commit), not four (BEGIN,
    the setting, the statement, COMMIT)."""
    return _fast(sql, params, lambda cursor: int(cursor.rowcount))


def fast_statement_row(sql: str, params: Sequence[Any]) -> tuple[Any, ...] | None:
    """fast_statement for a statement that returns a row (``RETURNING``): the row, or None
    when it wrote none."""

    def first(cursor: Any) -> tuple[Any, ...] | None:
        row = cursor.fetchone()
        return None if row is None else tuple(row)

    return _fast(sql, params, first)


def _fast(sql: str, params: Sequence[Any], result: Callable[[Any], T]) -> T:
    with connection.cursor() as cursor:
        alone = not connection.in_atomic_block and connection.get_autocommit()
        if alone and takes_several_statements(cursor):
            cursor.execute(f"{FAST_COMMIT_SQL}; {sql}", params)
            cursor.nextset()  # the statement's result, after the setting's
            return result(cursor)
    with fast_commit(), connection.cursor() as cursor:
        cursor.execute(sql, params)
        return result(cursor)


def sandbox_transition(
    sandbox: Sandbox,
    to: str,
    *,
    where: Mapping[str, Any] | None = None,
    from_state: str | None = None,
    **fields: Any,
) -> bool:
    """Move to state `to` if the current state allows it (and the row still matches `where`;
    and is `from_state`, when given). Conditional UPDATE, so two workers racing on one
    sandbox cannot both win. Returns whether this call won."""
    allowed_from = [
        state
        for state, targets in ALLOWED_TRANSITIONS.items()
        if to in targets and from_state in (None, state)
    ]
    if where or not allowed_from or not _plain_values(fields):
        with fast_commit():
            updated = Sandbox.objects.filter(
                state__in=allowed_from, **dict(where or {})
            ).update_row(sandbox.pk, state=to, **fields)
    else:
        updated = _transition_update(sandbox.pk, to, allowed_from, fields)
    if updated:
        sandbox.state = to
        for name, value in fields.items():
            setattr(sandbox, name, value)
    return bool(updated)


def sandbox_started(sandbox: Sandbox, principal: Principal | None, **fields: Any) -> bool:
    """The move that ends every create: sandbox_transition(sandbox, RUNNING,
    from_state=CREATING, **fields).

    Where the row cache runs (PostgreSQL and Redis) and the create's authentication read
    the epoch, the UPDATE also returns the row as an operation reads it (with its
    organization's) and this process keeps it, and its plain part as a read takes it
    (row_cache.keep_created): the sandbox's next request, nearly always its first command,
    then reads no row from the database."""
    epoch = epoch_read_with(principal)
    if epoch is None or connection.vendor != "postgresql" or not _plain_values(fields):
        return sandbox_transition(
            sandbox, SandboxState.RUNNING, from_state=SandboxState.CREATING, **fields
        )
    values = _values(SandboxState.RUNNING, fields)
    row = fast_statement_row(
        _started_sql(tuple(fields)), [*values, sandbox.pk, str(SandboxState.CREATING)]
    )
    if row is None:
        return False
    # Out of CREATING: no process holds the row, so no generation is written (see
    # _transition_update).
    sandbox.state = SandboxState.RUNNING
    for name, value in fields.items():
        setattr(sandbox, name, value)
    keep_started_row(sandbox, row, epoch)
    return True


def keep_started_row(sandbox: Sandbox, row: tuple[Any, ...], epoch: Any) -> None:
    """Keep `row` (SANDBOX_WITH_ORGANIZATION's, as the write that made `sandbox` running
    returned it) and its plain part, under `epoch`, read before that write."""
    for lookup, kept in (
        (SANDBOX_WITH_ORGANIZATION, row),
        (SANDBOX_BY_ID_AND_ORGANIZATION, row[: SANDBOX_BY_ID_AND_ORGANIZATION.width()]),
    ):
        keep_created(
            lookup,
            kept,
            sandbox_id=sandbox.pk,
            organization_id=sandbox.organization_id,
            epoch=epoch,
        )


@cache
def _started_sql(names: tuple[str, ...]) -> str:
    quote = connection.ops.quote_name
    meta, columns = Sandbox._meta, _columns()
    table = quote(meta.db_table)
    sets = ", ".join(f"{quote(columns[name].column)} = %s" for name in ("state", *names))
    where = (
        f"{table}.{quote(meta.pk.column)} = %s AND {table}.{quote(columns['state'].column)} = %s"
    )
    return SANDBOX_WITH_ORGANIZATION.update_sql(sets, where)


def _values(to: str, fields: Mapping[str, Any]) -> list[Any]:
    """The new state's and `fields`' values, prepared by their fields as the ORM's update()
    prepares them, in the order of `fields`."""
    columns = _columns()
    values = [columns["state"].get_db_prep_save(to, connection)]
    values += [columns[name].get_db_prep_save(value, connection) for name, value in fields.items()]
    return values


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
    updated = fast_statement(
        _transition_sql(tuple(fields), len(allowed_from)),
        [*_values(to, fields), pk, *map(str, allowed_from)],
    )
    # No process keeps a row that is still being created (row_cache.NEVER_KEPT_STATE): a move
    # out of that state alone changes no row any process holds.
    if updated and allowed_from != [NEVER_KEPT_STATE]:
        rows_changed([pk])
    return updated


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
