"""Who asks for a sandbox operation, and the one place an operation is authorized and counted.

Every sandbox service that runs something takes a `Caller` and wraps its provider call in
`metered(...)`: token scope, then billing authorization (402), then the call, then one usage
record. Interfaces (REST views, WebSocket consumers, the preview proxy, tasks) build the
Caller and call the service; none of them talks to billing. An Idempotency-Key is settled at
the REST edge (`request_begin`/`request_finish`): a replay never reaches a service, and a
first run hands the service the event id of its idempotency record, so a retry after a
crash is counted once.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from accounts.authentication import Principal
from billing.idempotency import (
    StoredResponse,
    idempotency_abort,
    idempotency_begin,
    idempotency_complete,
    idempotency_event_id,
)
from billing.metering import metering_authorize, metering_record
from common.database_errors import StorageFull
from common.errors import Forbidden, PaymentRequired

__all__ = [
    "PLATFORM",
    "Caller",
    "StoredResponse",
    "billing_allows",
    "billing_authorize",
    "billing_record",
    "metered",
    "request_begin",
    "request_finish",
]


@dataclass(frozen=True)
class Caller:
    """The party an operation runs for, as the services see it."""

    principal: Principal | None
    """Who asks (session user, API key or sandbox token), already authenticated and, for a
    sandbox, already past the tenancy selector. None only for the platform itself."""
    event_id: str | None = None
    """The usage event id to count this operation under: an Idempotency-Key's record, so a
    retry of one request counts once. None: a fresh id per operation."""
    billed: bool = True
    """False for work the platform does on its own account: the reaper, the reconciler, and
    the steps inside a one-shot run (the run itself is the one counted operation)."""

    def unbilled(self) -> Caller:
        """The same party, for steps that are part of an operation already counted."""
        return replace(self, billed=False, event_id=None)

    def require_scope(self, scope: str | None) -> None:
        """Raise Forbidden 'scope_missing' when a sandbox token lacks `scope`."""
        if scope and self.principal is not None and not self.principal.has_scope(scope):
            raise Forbidden(f"This token lacks the '{scope}' scope.", code="scope_missing")


PLATFORM = Caller(principal=None, billed=False)
"""The platform acting for itself (reaper, reconciler, staff tools): never refused, never
counted."""


def billing_authorize(caller: Caller, feature: str) -> None:
    """Raise PaymentRequired (402) when the caller's plan, allowance or cap refuses `feature`
    now. Nothing is counted. A no-op for unbilled callers."""
    principal = caller.principal
    if caller.billed and principal is not None:
        metering_authorize(
            organization=principal.organization, feature=feature, read=principal.take_values
        )


def billing_allows(caller: Caller, feature: str) -> bool:
    """Whether `feature` would be authorized now (for optional extras such as port events)."""
    try:
        billing_authorize(caller, feature)
    except (PaymentRequired, StorageFull):
        return False
    return True


def billing_record(caller: Caller, operation: str, event_id: str | None = None) -> None:
    """Count one execution of `operation` for the caller (under `event_id`, else the
    caller's, else a fresh one). A no-op for unbilled callers."""
    principal = caller.principal
    if not caller.billed or principal is None:
        return
    metering_record(
        organization_id=principal.organization.pk,
        api_key_id=principal.api_key.pk if principal.api_key else None,
        operation=operation,
        event_id=event_id or caller.event_id or uuid.uuid4().hex,
    )


@contextmanager
def metered(
    caller: Caller,
    *,
    feature: str,
    operation: str,
    scope: str | None = None,
    teardown: bool = False,
) -> Iterator[None]:
    """Scope check, billing authorization, the body, then one usage record if it succeeded.

    `teardown`: destroying or stopping, which billing never refuses (an organization past
    its allowance or cap must be able to stop what runs); it is counted only while billing
    would have allowed it, so it never takes a total past the allowance or cap; nor on a disk
    too full to keep its record (the meter's StorageFull), which must not keep a sandbox
    running. An exception from the body propagates and nothing is counted."""
    caller.require_scope(scope)
    counted = True
    try:
        billing_authorize(caller, feature)
    except (PaymentRequired, StorageFull):
        if not teardown:
            raise
        counted = False
    yield
    if counted:
        billing_record(caller, operation)


# --- Idempotency-Key, at the REST edge ------------------------------------------------------


def request_begin(
    principal: Principal, *, key: str | None, fingerprint: str
) -> Caller | StoredResponse:
    """The Caller for one REST request, or the stored response to replay.

    Without a key: a Caller with a fresh event id per operation. With one: reserves it
    (billing.idempotency) and returns a Caller counting under the key's record, or the
    StoredResponse of the request that already ran. Raises what idempotency_begin raises
    (422 reused with another body, 409 in progress, 400 bad key)."""
    if key is None:
        return Caller(principal)
    organization_id = principal.organization.pk
    stored = idempotency_begin(organization_id=organization_id, key=key, fingerprint=fingerprint)
    if stored is not None:
        return stored
    return Caller(
        principal, event_id=idempotency_event_id(organization_id=organization_id, key=key)
    )


def request_finish(
    principal: Principal, *, key: str | None, response: StoredResponse | None
) -> None:
    """Store `response` for replay under `key`, or free the key (None: the request failed,
    so a retry runs the operation again)."""
    if key is None:
        return
    organization_id = principal.organization.pk
    if response is None:
        idempotency_abort(organization_id=organization_id, key=key)
    else:
        idempotency_complete(organization_id=organization_id, key=key, response=response)
