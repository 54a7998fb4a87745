"""Who is on the other end of a socket (WebSocket consumers and the preview proxy)."""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs

from django.db import DatabaseError
from rest_framework.exceptions import AuthenticationFailed

from accounts.authentication import (
    Principal,
    key_principal,
    principal_for_session_user,
    principal_from_sandbox_token,
    request_principal_from_sandbox_token,
)
from accounts.services import API_KEY_PREFIX
from accounts.tokens import looks_like_jwt
from common import database_errors
from common.errors import NotFound, PaymentRequired
from sandboxes.caller import Caller, billing_authorize
from sandboxes.models import Sandbox
from sandboxes.selectors import sandbox_get_for_principal

WS_AUTH_FAILED = 4401
WS_PAYMENT_REQUIRED = 4402
WS_FORBIDDEN = 4403
WS_NOT_FOUND = 4404
WS_UNAVAILABLE = 4503


class RealtimeDenied(Exception):
    """A socket (or preview request) may not proceed. `close_code` is the WebSocket close code;
    `http_status` what the preview proxy answers; `code`/`message` the error body."""

    def __init__(self, close_code: int, http_status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.close_code = close_code
        self.http_status = http_status
        self.code = code
        self.message = message


def _header(scope: Mapping[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return None


def _query_param(scope: Mapping[str, Any], name: str) -> str | None:
    values = parse_qs((scope.get("query_string") or b"").decode("latin-1")).get(name)
    return values[-1] if values else None


def principal_from_scope(scope: Mapping[str, Any], *, cookie_token: str | None = None) -> Principal:
    """Resolve the caller of an ASGI scope to a Principal (synchronous: ORM inside).

    Order: `?token=` sandbox JWT, then `Authorization: Bearer` (API key or JWT), then
    `cookie_token` (the preview proxy's path-scoped cookie), then the browser session.
    A credential that is presented but invalid is refused (never falls through to the
    next one). Raises RealtimeDenied(4401) when there is no valid credential.
    """

    def denied(message: str) -> RealtimeDenied:
        return RealtimeDenied(WS_AUTH_FAILED, 401, "authentication_failed", message)

    def from_token(token: str) -> Principal | None:
        # A preview's request reads what it needs with the token, as the REST API does; a
        # socket keeps its principal, so it reads nothing ahead (accounts.authentication).
        if scope.get("type") == "http":
            return request_principal_from_sandbox_token(token, method=str(scope.get("method")))
        return principal_from_sandbox_token(token)

    token = _query_param(scope, "token")
    if token:
        principal = from_token(token)
        if principal is None:
            raise denied("The sandbox token is not valid or has expired.")
        return principal
    authorization = _header(scope, b"authorization")
    if authorization:
        parts = authorization.split()
        if len(parts) != 2 or parts[0].lower() != "bearer":
            raise denied("Use 'Authorization: Bearer <API key or sandbox token>'.")
        secret = parts[1]
        if secret.startswith(API_KEY_PREFIX):
            try:
                # No throttle: nothing read ahead, so a socket may keep the principal.
                return key_principal(secret)
            except AuthenticationFailed:
                raise denied("Unknown, revoked or expired API key.") from None
        if looks_like_jwt(secret):
            principal = from_token(secret)
            if principal is None:
                raise denied("The sandbox token is not valid or has expired.")
            return principal
        raise denied("Unknown credential.")
    if cookie_token:
        principal = from_token(cookie_token)
        if principal is not None:
            return principal
    user = scope.get("user")
    if user is not None and getattr(user, "is_authenticated", False):
        principal = principal_for_session_user(
            SimpleNamespace(user=user, session=scope.get("session"))
        )
        if principal is not None:
            return principal
    raise denied("Sign in, or pass an API key (Authorization header) or ?token=.")


def realtime_authorize(
    scope: Mapping[str, Any],
    *,
    sandbox_id: str,
    required_scope: str | None,
    feature: str | None,
    cookie_token: str | None = None,
) -> tuple[Caller, Sandbox]:
    """Authenticate, apply tenancy and token scope, and admit a socket on one sandbox.

    Returns (caller, sandbox). Raises RealtimeDenied: 4401 no/invalid credential, 4404 not
    this caller's sandbox (also another sandbox's token), 4403 token scope missing, 4402 the
    plan does not allow `feature` now. Admitting counts nothing: each operation on the
    socket is counted by its service. 4503 (HTTP 503): the database could not serve."""
    try:
        return _authorized(scope, sandbox_id, required_scope, feature, cookie_token)
    except DatabaseError as exc:
        if not database_errors.database_unavailable(exc):
            raise
        raise RealtimeDenied(
            WS_UNAVAILABLE, 503, database_errors.CODE, database_errors.MESSAGE
        ) from None


def _authorized(
    scope: Mapping[str, Any],
    sandbox_id: str,
    required_scope: str | None,
    feature: str | None,
    cookie_token: str | None,
) -> tuple[Caller, Sandbox]:
    principal = principal_from_scope(scope, cookie_token=cookie_token)
    try:
        sandbox = sandbox_get_for_principal(principal=principal, sandbox_id=sandbox_id)
    except NotFound as exc:
        raise RealtimeDenied(WS_NOT_FOUND, 404, exc.code, exc.message) from None
    if required_scope and not principal.has_scope(required_scope):
        raise RealtimeDenied(
            WS_FORBIDDEN, 403, "scope_missing", f"This token lacks the '{required_scope}' scope."
        )
    caller = Caller(principal)
    if feature:
        try:
            billing_authorize(caller, feature)
        except PaymentRequired as exc:
            raise RealtimeDenied(WS_PAYMENT_REQUIRED, 402, exc.code, exc.message) from None
    return caller, sandbox
