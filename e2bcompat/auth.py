"""Who calls the E2B layer: an API key in E2B's header, or the envd access token.

The SDK sends the API key as `X-API-Key` to the control plane only. Requests to envd (the
process and filesystem services, /files, /health) carry `X-Access-Token`: the sandbox token
Sandpit minted when the sandbox was created or connected, and `E2b-Sandbox-Id` naming the
sandbox. Both resolve to the same Principal Sandpit's own API uses, and the sandbox goes
through the same tenancy selector: another organization's sandbox is a 404.
"""

from __future__ import annotations

from collections.abc import Mapping

from rest_framework import authentication, exceptions
from rest_framework.request import Request

from accounts.authentication import (
    MachineUser,
    Principal,
    api_key_principal,
    key_principal,
    request_principal_from_sandbox_token,
    view_redis_throttle,
)
from accounts.services import API_KEY_PREFIX
from accounts.throttling import PerKeyRateThrottle
from accounts.tokens import looks_like_jwt
from sandboxes.models import Sandbox
from sandboxes.selectors import sandbox_get_for_principal

API_KEY_HEADER = "x-api-key"
ACCESS_TOKEN_HEADER = "x-access-token"  # noqa: S105 - a header name
SANDBOX_ID_HEADER = "e2b-sandbox-id"
ENVD_SCOPES = ("exec", "files", "terminal", "ports")
"""What the envd access token may do: everything envd serves, on its one sandbox."""


class E2BAuthFailed(Exception):
    """No valid credential (401)."""


def principal_from_headers(
    headers: Mapping[str, str], *, method: str, throttle: PerKeyRateThrottle | None = None
) -> Principal:
    """The caller of a `method` request with lower-cased `headers` (synchronous: ORM
    inside). A token's request is counted for `throttle`'s rate limit in the round trip
    that reads what its operation needs (accounts.authentication).

    `X-API-Key` (a Sandpit API key), else `X-Access-Token` (a sandbox token). A credential
    that is present but invalid is refused, never skipped. Raises E2BAuthFailed."""
    secret = headers.get(API_KEY_HEADER)
    if secret is not None:
        if not secret.startswith(API_KEY_PREFIX):
            raise E2BAuthFailed("Unknown API key: use a Sandpit API key (sp_...).")
        try:
            return key_principal(
                secret,
                throttle=throttle,
                method=method,
                url_kwargs={"sandbox_id": headers.get(SANDBOX_ID_HEADER, "")},
            )
        except exceptions.AuthenticationFailed as exc:
            raise E2BAuthFailed(str(exc.detail)) from None
    token = headers.get(ACCESS_TOKEN_HEADER)
    if token and looks_like_jwt(token):
        principal = request_principal_from_sandbox_token(token, method=method, throttle=throttle)
        if principal is not None:
            return principal
        raise E2BAuthFailed("The access token is not valid or has expired.")
    raise E2BAuthFailed("Pass a Sandpit API key in X-API-Key (E2B_API_KEY).")


def envd_sandbox(headers: Mapping[str, str], *, principal: Principal) -> tuple[Principal, Sandbox]:
    """Caller and sandbox of an envd request (`principal`: the caller resolved from these
    headers). Raises NotFound (404: no E2b-Sandbox-Id, a miss, another organization's
    sandbox, another sandbox's token)."""
    sandbox_id = headers.get(SANDBOX_ID_HEADER, "")
    return principal, sandbox_get_for_principal(principal=principal, sandbox_id=sandbox_id)


def _request_headers(request: Request) -> dict[str, str]:
    return {k.lower(): v for k, v in request.headers.items()}


class E2BAuthentication(authentication.BaseAuthentication):
    """DRF authentication for the E2B views: X-API-Key or X-Access-Token."""

    def authenticate(self, request: Request) -> tuple[MachineUser, Principal]:
        headers = _request_headers(request)
        secret = headers.get(API_KEY_HEADER)
        if secret and secret.startswith(API_KEY_PREFIX):
            # As Sandpit's own API: a key this process knows is confirmed in Redis.
            principal = api_key_principal(request, secret)
            return MachineUser(f"key:{principal.api_key.pk}"), principal  # type: ignore[union-attr]
        try:
            principal = principal_from_headers(
                headers,
                method=request.method or "",
                throttle=view_redis_throttle(request),
            )
        except E2BAuthFailed as exc:
            raise exceptions.AuthenticationFailed(str(exc)) from None
        ident = f"key:{principal.api_key.pk}" if principal.api_key else "token"
        return MachineUser(ident), principal

    def authenticate_header(self, request: Request) -> str:
        return "X-API-Key"
