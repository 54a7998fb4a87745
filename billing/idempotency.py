"""`Idempotency-Key` on metered REST calls: run and bill a request once, replay it after.

Stored in the database (one row per organization and key) so a replay survives restarts
and the unique constraint settles races between two copies of one request. A key stays
known for 24 hours (purged by the hourly close task). A key left in flight by a crashed
worker is taken over after IN_FLIGHT_LEASE, so it cannot block retries forever.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from common.errors import ApplicationError, Conflict

from .models import IdempotencyRecord, IdempotencyState

IN_FLIGHT_LEASE = timedelta(minutes=10)
"""Longer than the longest command (SANDPIT_MAX_COMMAND_TIMEOUT_S, 5 minutes by default)."""
MAX_KEY_CHARS = 255


@dataclass(frozen=True)
class StoredResponse:
    """The response the first request with a key produced, replayed to its retries."""

    status_code: int
    body: bytes
    content_type: str


def idempotency_begin(*, organization_id: int, key: str, fingerprint: str) -> StoredResponse | None:
    """Reserve `key` for this organization, or return the response to replay.

    None: first time (the key is now in flight; call idempotency_complete or _abort).
    A StoredResponse: the request already ran; replay it without running or counting.
    Raises ApplicationError 'idempotency_key_reused' (422) when `fingerprint` (method, path
    and body hash) differs from the first request's, Conflict 'idempotency_in_progress'
    (409) while the first request is still running, and 'validation_error' (400) for a
    key that is empty or longer than 255 characters.
    """
    if not key or len(key) > MAX_KEY_CHARS:
        raise ApplicationError(
            f"Idempotency-Key must be 1 to {MAX_KEY_CHARS} characters.", code="validation_error"
        )
    for _ in range(3):  # the row may vanish (aborted) between our insert and our read
        now = timezone.now()
        try:
            with transaction.atomic():
                IdempotencyRecord.objects.create(
                    organization_id=organization_id,
                    key=key,
                    fingerprint=fingerprint,
                    state=IdempotencyState.IN_FLIGHT,
                    created_at=now,
                )
            return None
        except IntegrityError:
            pass
        record = IdempotencyRecord.objects.filter(organization_id=organization_id, key=key).first()
        if record is None:
            continue
        if record.fingerprint != fingerprint:
            raise ApplicationError(
                "This Idempotency-Key was already used with a different request "
                "(method, path or body). Use a new key for a new request.",
                code="idempotency_key_reused",
                status_code=422,
            )
        if record.state == IdempotencyState.COMPLETED:
            return StoredResponse(
                status_code=record.status_code or 200,
                body=bytes(record.body or b""),
                content_type=record.content_type,
            )
        if record.created_at < now - IN_FLIGHT_LEASE:
            taken = IdempotencyRecord.objects.filter(
                pk=record.pk, state=IdempotencyState.IN_FLIGHT, created_at=record.created_at
            ).update(created_at=now)
            if taken:
                return None
        raise Conflict(
            "A request with this Idempotency-Key is still in progress; retry when it has finished.",
            code="idempotency_in_progress",
        )
    raise Conflict("This Idempotency-Key is changing hands; retry.", code="idempotency_in_progress")


def idempotency_event_id(*, organization_id: int, key: str) -> str:
    """The usage event id for the request holding `key`: one per idempotency record, not per
    key. A retry of that request (a replay, or a takeover after the lease) shares it, so it
    is counted once; the same key sent again after the record was purged (or aborted) is a
    new request and is counted again. Raises IdempotencyRecord.DoesNotExist when no
    request holds the key."""
    pk = (
        IdempotencyRecord.objects.filter(organization_id=organization_id, key=key)
        .values_list("pk", flat=True)
        .get()
    )
    return f"idem:{organization_id}:{pk}"


def idempotency_complete(*, organization_id: int, key: str, response: StoredResponse) -> None:
    """Store the response of the request holding `key`, for replay to its retries."""
    IdempotencyRecord.objects.filter(
        organization_id=organization_id, key=key, state=IdempotencyState.IN_FLIGHT
    ).update(
        state=IdempotencyState.COMPLETED,
        status_code=response.status_code,
        body=response.body,
        content_type=response.content_type,
        completed_at=timezone.now(),
    )


def idempotency_abort(*, organization_id: int, key: str) -> None:
    """The request failed: free `key` so a retry runs the operation."""
    IdempotencyRecord.objects.filter(
        organization_id=organization_id, key=key, state=IdempotencyState.IN_FLIGHT
    ).delete()
