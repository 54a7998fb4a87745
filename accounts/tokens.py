"""Short-lived JWTs scoped to one sandbox and a set of permissions (HS256 only).

Every token names who minted it (an API key or a signed-in user). A token is only as good as
its minter: accounts.authentication re-checks the minter on each use, so revoking the key or
removing the member ends the token within seconds rather than at its expiry.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import jwt
from django.conf import settings

TOKEN_SCOPES = ("terminal", "files", "exec", "ports")
MAX_TOKEN_TTL_S = 24 * 3600
_ALGORITHM = "HS256"
_AUDIENCE = "sandpit-sandbox"


@dataclass(frozen=True)
class TokenMinter:
    """Who minted a token: the API key (`kind="key"`) or the user (`kind="user"`)."""

    kind: str
    id: int


@dataclass(frozen=True)
class SandboxTokenClaims:
    sandbox_id: str
    organization_id: int
    scopes: frozenset[str]
    expires_at: int
    """Unix seconds."""
    token_id: str
    minted_by: TokenMinter


class InvalidSandboxToken(Exception):
    pass


def sandbox_token_encode(
    *,
    sandbox_id: str,
    organization_id: int,
    scopes: list[str],
    ttl_s: int,
    api_key_id: int | None = None,
    user_id: int | None = None,
) -> tuple[str, int]:
    """Sign a token; returns (token, expires_at unix seconds).

    Pass the minter: `api_key_id` or `user_id`. A token without one is refused when it is
    presented (sandbox_token_decode), since nothing could revoke it."""
    now = int(time.time())
    expires_at = now + ttl_s
    payload: dict[str, object] = {
        "sub": sandbox_id,
        "org": organization_id,
        "scp": sorted(set(scopes)),
        "iat": now,
        "exp": expires_at,
        "aud": _AUDIENCE,
        "jti": uuid.uuid4().hex,
    }
    if api_key_id is not None:
        payload["key"] = api_key_id
    elif user_id is not None:
        payload["usr"] = user_id
    return jwt.encode(payload, settings.SANDBOX_TOKEN_SECRET, algorithm=_ALGORITHM), expires_at


def sandbox_token_decode(token: str) -> SandboxTokenClaims:
    """Verify signature, algorithm (HS256 only, so `alg: none` fails), expiry and audience."""
    try:
        payload = jwt.decode(
            token,
            settings.SANDBOX_TOKEN_SECRET,
            algorithms=[_ALGORITHM],
            audience=_AUDIENCE,
            options={"require": ["exp", "sub", "aud", "scp", "org"]},
        )
    except jwt.ExpiredSignatureError as exc:
        raise InvalidSandboxToken("The sandbox token has expired.") from exc
    except jwt.PyJWTError as exc:
        raise InvalidSandboxToken("The sandbox token is not valid.") from exc
    scopes = payload.get("scp")
    if not isinstance(scopes, list) or not all(s in TOKEN_SCOPES for s in scopes):
        raise InvalidSandboxToken("The sandbox token has unknown scopes.")
    minted_by = _minter(payload)
    if minted_by is None:
        raise InvalidSandboxToken("The sandbox token does not name who minted it.")
    return SandboxTokenClaims(
        sandbox_id=str(payload["sub"]),
        organization_id=int(payload["org"]),
        scopes=frozenset(scopes),
        expires_at=int(payload["exp"]),
        token_id=str(payload.get("jti", "")),
        minted_by=minted_by,
    )


def _minter(payload: dict[str, object]) -> TokenMinter | None:
    for claim, kind in (("key", "key"), ("usr", "user")):
        value = payload.get(claim)
        if isinstance(value, int) and not isinstance(value, bool):
            return TokenMinter(kind=kind, id=value)
    return None


def looks_like_jwt(value: str) -> bool:
    return value.count(".") == 2 and not value.startswith("sp_")
