"""Who is calling: an API key, a sandbox token, or a browser session.

Each authentication class sets `request.auth` to a Principal, so views and
consumers ask one object for the organization and what the caller may do.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING

import redis
from django.utils import timezone
from rest_framework import authentication, exceptions

from . import authentication_reads, keycache
from .models import ApiKey, Membership, Organization
from .principal import MachineUser, Principal
from .selectors import current_membership_for_session
from .services import API_KEY_PREFIX, api_key_authenticate
from .throttling import PerKeyRateThrottle
from .tokens import (
    InvalidSandboxToken,
    SandboxTokenClaims,
    TokenMinter,
    looks_like_jwt,
    sandbox_token_decode,
)

if TYPE_CHECKING:  # DRF's API settings import this module; only the type is needed
    from rest_framework.request import Request

MINTER_RECHECK_S = 3.0
"""How long a minter found active (or not) is believed without asking the database again:
the longest a revoked key or removed member's tokens keep working in one process."""


def _bearer(request: Request) -> str | None:
    header = authentication.get_authorization_header(request).decode("latin-1")
    parts = header.split()
    if len(parts) != 2 or parts[0].lower() != "bearer":
        return None
    return parts[1]


class ApiKeyAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer sp_...`. Unknown, revoked or expired keys get 401.

    A key this process has verified is confirmed in Redis instead of read from the
    database (accounts.keycache), in the round trip that also counts the request for the
    view's rate limit; a revocation in any process is refused on the next request."""

    def authenticate(self, request: Request) -> tuple[object, Principal] | None:
        secret = _bearer(request)
        if secret is None or not secret.startswith(API_KEY_PREFIX):
            return None
        principal = api_key_principal(request, secret)
        return MachineUser(f"key:{principal.api_key.pk}"), principal  # type: ignore[union-attr]

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="api"'


def api_key_principal(request: Request, secret: str) -> Principal:
    """The principal of the API key `secret` presented with `request`: confirmed in Redis
    when this process knows the key (in the round trip that counts the request for the
    view's rate limit), else read from the database. Raises AuthenticationFailed for an
    unknown, revoked or expired key."""
    return key_principal(
        secret,
        throttle=view_redis_throttle(request),
        method=request.method or "",
        url_kwargs=(getattr(request, "parser_context", None) or {}).get("kwargs") or {},
    )


def key_principal(
    secret: str,
    *,
    throttle: PerKeyRateThrottle | None = None,
    method: str = "",
    url_kwargs: Mapping[str, object] | None = None,
) -> Principal:
    """`api_key_principal` for a caller without a DRF request: an E2B RPC (with the throttle
    it counts in, and the sandbox it names as `url_kwargs`), a socket or a preview request
    (no throttle: nothing is read ahead, so a socket may keep the principal). Raises
    AuthenticationFailed for an unknown, revoked or expired key."""
    principal = (
        _cached_key_principal(secret, throttle, method, url_kwargs or {})
        if keycache.enabled()
        else None
    )
    if principal is None:
        api_key = api_key_authenticate(secret)
        if api_key is None:
            raise exceptions.AuthenticationFailed("Unknown, revoked or expired API key.")
        if keycache.enabled():
            keycache.known_put(keycache.digest(secret), api_key, None)
        principal = Principal(organization=api_key.organization, api_key=api_key)
    return principal


LAST_USED_EVERY = timedelta(seconds=60)
"""How often a key's last_used_at is written (as api_key_authenticate does)."""


def _cached_key_principal(
    secret: str,
    throttle: PerKeyRateThrottle | None,
    method: str,
    url_kwargs: Mapping[str, object],
) -> Principal | None:
    """The principal of a key this process knows, confirmed unchanged; None to read the
    database (unknown here, unconfirmed, changed, or Redis unreachable). A key that changed
    is re-read at once, and kept under the generation read before that read. With
    `throttle`, the request is counted and other apps' keys are read in the same round trip."""
    found_by = keycache.digest(secret)
    entry = keycache.known_get(found_by)
    if entry is None:
        return None
    keys = keycache.generation_keys(entry.prefix)
    verdict = None
    read: dict[str, object] = {}
    try:
        if throttle is not None:
            # Other apps' keys for the organization ride along (authentication_reads).
            extra = authentication_reads.keys_for(
                entry.organization_id
            ) + authentication_reads.request_keys_for(method, url_kwargs)
            verdict, values = throttle.count(throttle.key_bucket(entry.id), read=keys + extra)
            read = dict(zip(extra, values[len(keys) :], strict=True))
        else:
            values = keycache.generation_values(keys)
        seen = keycache.generation_of(values[: len(keys)])
    except redis.RedisError:
        return None
    if seen is None or seen != entry.generation:
        api_key = api_key_authenticate(secret)
        if api_key is None:
            raise exceptions.AuthenticationFailed("Unknown, revoked or expired API key.")
        keycache.known_put(found_by, api_key, seen)
        return Principal(
            organization=api_key.organization, api_key=api_key, rate=verdict, read=read
        )
    now = timezone.now()
    if entry.expires_at is not None and entry.expires_at <= now:
        raise exceptions.AuthenticationFailed("Unknown, revoked or expired API key.")
    if entry.last_used_at is None or now - entry.last_used_at > LAST_USED_EVERY:
        ApiKey.objects.filter(pk=entry.id).update(last_used_at=now)
        entry = entry.with_field("last_used_at", now)
        keycache.known_replace(found_by, entry)
    return Principal(
        organization_id=entry.organization_id, api_key=entry.api_key(), rate=verdict, read=read
    )


def view_redis_throttle(request: Request) -> PerKeyRateThrottle | None:
    """The view's per-key throttle when it counts in Redis (so a key's confirmation, or what
    a token's request reads, can ride in its round trip); None otherwise."""
    view = (getattr(request, "parser_context", None) or {}).get("view")
    if view is None:
        return None
    for throttle in view.get_throttles():
        if isinstance(throttle, PerKeyRateThrottle) and throttle.counts_in_redis():
            return throttle
    return None


class TokenRefused(exceptions.APIException):
    """A valid sandbox token presented to an endpoint it may not use (403), or to another
    sandbox's endpoint (404, like any other miss)."""

    def __init__(self, status_code: int, code: str, message: str) -> None:
        super().__init__(message, code)
        self.status_code = status_code
        # common.errors renders `default_code` as the error code of a DRF exception.
        self.default_code = code


class SandboxTokenAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer <jwt>` minted for one sandbox.

    Deny by default: a token is refused by every view unless the view lists the HTTP method
    in `sandbox_token_methods`, the URL's `sandbox_id` is the token's sandbox, and the token
    carries the view's `required_scope` (when it has one). The check lives here, in the only
    place a REST token principal is made, so a new view cannot forget it: forgetting to list
    a method refuses tokens there."""

    def authenticate(self, request: Request) -> tuple[object, Principal] | None:
        token = _bearer(request)
        if token is None or not looks_like_jwt(token):
            return None
        claims = _active_token_claims(token)
        if claims is None:
            raise exceptions.AuthenticationFailed("The sandbox token is not valid or has expired.")
        context = getattr(request, "parser_context", None) or {}
        method = request.method or ""  # never None for a request a server parsed
        sandbox_token_gate(
            claims, view=context.get("view"), method=method, kwargs=context.get("kwargs") or {}
        )
        principal = _token_principal_with_reads(claims, method, view_redis_throttle(request))
        if principal is None:
            principal = _token_principal_from_database(claims)
        if principal is None:
            raise exceptions.AuthenticationFailed("The sandbox token is not valid or has expired.")
        return MachineUser(f"token:{claims.token_id}"), principal

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="api"'


def sandbox_token_gate(
    claims: SandboxTokenClaims, *, view: object, method: str, kwargs: Mapping[str, object]
) -> None:
    """Raise TokenRefused unless `view` lets sandbox tokens call `method` on this token's
    sandbox with this token's scopes (see SandboxTokenAuthentication)."""
    allowed: Collection[str] = getattr(view, "sandbox_token_methods", ())
    if method.upper() not in allowed or "sandbox_id" not in kwargs:
        raise TokenRefused(
            403, "token_not_allowed", "Sandbox tokens cannot do this; use an API key."
        )
    if str(kwargs["sandbox_id"]) != claims.sandbox_id:
        raise TokenRefused(404, "sandbox_not_found", "No such sandbox.")
    scope = getattr(view, "required_scope", None)
    if scope and scope not in claims.scopes:
        raise TokenRefused(403, "scope_missing", f"This token lacks the '{scope}' scope.")


def principal_from_sandbox_token(token: str) -> Principal | None:
    """The principal of a valid token whose minter is still active, else None. Its
    organization's row is read now: for a caller that keeps the principal (a WebSocket);
    one request's caller takes `request_principal_from_sandbox_token`."""
    claims = _active_token_claims(token)
    return None if claims is None else _token_principal_from_database(claims)


def request_principal_from_sandbox_token(
    token: str, *, method: str, throttle: PerKeyRateThrottle | None = None
) -> Principal | None:
    """The principal of a valid token whose minter is still active, for one request: as
    cheap as a known API key's (see `_token_principal_with_reads`; `throttle` counts the
    request in the same round trip). None when invalid."""
    claims = _active_token_claims(token)
    if claims is None:
        return None
    principal = _token_principal_with_reads(claims, method, throttle)
    return principal or _token_principal_from_database(claims)


def _active_token_claims(token: str) -> SandboxTokenClaims | None:
    try:
        claims = sandbox_token_decode(token)
    except InvalidSandboxToken:
        return None
    if not minter_active(claims.minted_by, organization_id=claims.organization_id):
        return None
    return claims


def _token_principal_from_database(claims: SandboxTokenClaims) -> Principal | None:
    organization = Organization.objects.filter(pk=claims.organization_id).first()
    if organization is None:
        return None
    return Principal(organization=organization, token=claims)


def _token_principal_with_reads(
    claims: SandboxTokenClaims, method: str, throttle: PerKeyRateThrottle | None
) -> Principal | None:
    """A token's principal for one request, without reading its organization's row (loaded
    on first use, from this process's copy while Redis confirms it: accounts/orgcache.py).
    One Redis round trip, which also counts the request for `throttle`'s rate limit when
    given, reads what other apps registered for the organization and the token's sandbox
    (authentication_reads: the billing period's counters, the sandbox row's generation).
    Only for one request: those values are taken by its operation, and a principal kept
    longer (a WebSocket's) would hand them out stale. None without Redis or when it fails
    (the caller reads the database instead)."""
    if not keycache.enabled():
        return None
    keys = authentication_reads.keys_for(
        claims.organization_id
    ) + authentication_reads.request_keys_for(method, {"sandbox_id": claims.sandbox_id})
    verdict = None
    try:
        if throttle is not None:
            verdict, values = throttle.count(throttle.token_bucket(claims.token_id), read=keys)
        else:
            values = keycache.generation_values(keys) if keys else []
    except redis.RedisError:
        return None
    return Principal(
        organization_id=claims.organization_id,
        token=claims,
        rate=verdict,
        read=dict(zip(keys, values, strict=True)),
    )


_minter_checked: dict[tuple[str, int, int], tuple[float, bool]] = {}
_minter_lock = threading.Lock()


def minter_active(minter: TokenMinter, *, organization_id: int) -> bool:
    """Whether the key or user that minted a token may still act for the organization: the
    key is neither revoked nor expired; the user is active and still a member. Answers are
    kept MINTER_RECHECK_S seconds per process, so a busy terminal or preview does not ask
    the database on every request."""
    cache_key = (minter.kind, minter.id, organization_id)
    now = time.monotonic()
    with _minter_lock:
        cached = _minter_checked.get(cache_key)
    if cached is not None and now - cached[0] < MINTER_RECHECK_S:
        return cached[1]
    if minter.kind == "key":
        api_key = ApiKey.objects.filter(pk=minter.id, organization_id=organization_id).first()
        active = api_key is not None and api_key.is_active()
    else:
        active = Membership.objects.filter(
            user_id=minter.id, user__is_active=True, organization_id=organization_id
        ).exists()
    with _minter_lock:
        if len(_minter_checked) > 10_000:  # bound the memory: forget everything, re-ask
            _minter_checked.clear()
        _minter_checked[cache_key] = (now, active)
    return active


def minter_cache_clear() -> None:
    """Forget every cached minter answer (tests; after revoking in this process)."""
    with _minter_lock:
        _minter_checked.clear()


def principal_for_session_user(request: object) -> Principal | None:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return None
    membership = current_membership_for_session(request)
    if membership is None:
        return None
    return Principal(organization=membership.organization, user=user, role=membership.role)


class SessionAuthentication(authentication.SessionAuthentication):
    """Browser session (with CSRF), resolved to the session's current organization."""

    def authenticate(self, request: Request) -> tuple[object, Principal | None] | None:
        result = super().authenticate(request)
        if result is None:
            return None
        user, _ = result
        principal = principal_for_session_user(request._request)
        if principal is None:
            return user, None
        return user, _session_principal_with_reads(principal, request)


def _session_principal_with_reads(principal: Principal, request: Request) -> Principal:
    """A session's principal for this request, with what its operation will read in Redis
    read in the round trip that counts the request for the view's rate limit (the user's
    bucket), as a key's: the billing period, the sandbox row's generation. Unchanged when
    the view counts nothing in Redis, or Redis fails."""
    throttle = view_redis_throttle(request)
    if throttle is None or principal.user is None or not keycache.enabled():
        return principal
    keys = authentication_reads.keys_for(
        principal.organization_id
    ) + authentication_reads.request_keys_for(
        request.method or "",
        (getattr(request, "parser_context", None) or {}).get("kwargs") or {},
    )
    try:
        verdict, values = throttle.count(throttle.user_bucket(principal.user.pk), read=keys)
    except redis.RedisError:
        return principal
    return Principal(
        organization=principal.organization,
        user=principal.user,
        role=principal.role,
        rate=verdict,
        read=dict(zip(keys, values, strict=True)),
    )
