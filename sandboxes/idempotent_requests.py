"""Once per Idempotency-Key, for every REST entry point that changes something (Sandpit's API
and the E2B-compatible one): a retry of a request that finished gets the stored response
(Idempotent-Replayed: true) and runs and counts nothing; a failed one frees its key. The key's
event id rides on the Caller, so the operation's usage record is written once."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from django.http import HttpResponse
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response

from accounts.authentication import Principal
from accounts.permissions import principal_of
from common.errors import ApplicationError

from .caller import Caller, StoredResponse, request_begin, request_finish

MAX_IDEMPOTENCY_KEY = 255


def once_per_key(request: Any, run: Callable[[Caller], HttpResponse]) -> HttpResponse:
    """Run `run(caller)` once per Idempotency-Key: a retry of a finished request gets
    the stored response (Idempotent-Replayed: true) and runs and counts nothing."""
    principal: Principal = principal_of(request)
    key = request.headers.get("Idempotency-Key")
    if key is not None and (not key or len(key) > MAX_IDEMPOTENCY_KEY):
        raise ApplicationError(
            f"Idempotency-Key must be 1-{MAX_IDEMPOTENCY_KEY} characters.",
            code="validation_error",
        )
    begun = request_begin(
        principal, key=key, fingerprint=request_fingerprint(request) if key is not None else ""
    )
    if isinstance(begun, StoredResponse):
        replay = HttpResponse(begun.body, status=begun.status_code, content_type=begun.content_type)
        replay["Idempotent-Replayed"] = "true"
        return replay
    try:
        response = run(begun)
    except BaseException:
        request_finish(principal, key=key, response=None)
        raise
    request_finish(
        principal,
        key=key,
        response=None if response.status_code >= 400 else stored_response(response),
    )
    return response


def request_fingerprint(request: Any) -> str:
    """What makes two requests with one Idempotency-Key the same request."""
    digest = hashlib.sha256()
    digest.update(request.method.encode())
    digest.update(request.get_full_path().encode())
    digest.update(_body_as_read(request))
    return digest.hexdigest()


def _body_as_read(request: Any) -> bytes:
    """The request body as the view read it. File content is parsed from the stream, after
    which Django refuses request.body; JSON is parsed from request.body."""
    if request.method in ("GET", "HEAD"):
        return b""
    data = request.data
    return data if isinstance(data, bytes) else bytes(request.body)


def stored_response(response: HttpResponse) -> StoredResponse:
    """The response as kept for replays."""
    if isinstance(response, Response):
        body = JSONRenderer().render(response.data)
        content_type = "application/json"
    else:
        body = response.content
        content_type = response.get("Content-Type", "application/octet-stream")
    return StoredResponse(status_code=response.status_code, body=body, content_type=content_type)
