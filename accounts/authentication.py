"""Who is calling: an API key, a sandbox token, or a browser session.

Each authentication class sets `request.auth` to a Principal, so views and
consumers ask one object for the organization and what the caller may do.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rest_framework import authentication, exceptions

from .models import MANAGER_ROLES, ApiKey, Organization, User
from .selectors import current_organization_for_session, membership_get
from .services import API_KEY_PREFIX, api_key_authenticate
from .tokens import InvalidSandboxToken, SandboxTokenClaims, looks_like_jwt, sandbox_token_decode


@dataclass
class Principal:
    """The caller, resolved to one organization."""

    organization: Organization
    user: User | None = None
    api_key: ApiKey | None = None
    token: SandboxTokenClaims | None = None
    role: str | None = None
    """Membership role for session callers; None for keys and tokens."""
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def can_manage(self) -> bool:
        return self.role in MANAGER_ROLES

    def allows_sandbox(self, sandbox_id: str) -> bool:
        return self.token is None or self.token.sandbox_id == str(sandbox_id)

    def has_scope(self, scope: str) -> bool:
        return self.token is None or scope in self.token.scopes


class MachineUser:
    """request.user for key/token callers: authenticated, never staff."""

    is_authenticated = True
    is_anonymous = False
    is_staff = False
    is_superuser = False

    def __init__(self, ident: str) -> None:
        self.pk = ident
        self.id = ident

    def __str__(self) -> str:
        return self.pk


def _bearer(request: object) -> str | None:
    header = authentication.get_authorization_header(request).decode("latin-1")
    parts = header.split()
    if len(parts) != 2 or parts[0].lower() != "bearer":
        return None
    return parts[1]


class ApiKeyAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer sp_...`. Unknown, revoked or expired keys get 401."""

    def authenticate(self, request):  # type: ignore[no-untyped-def]
        secret = _bearer(request)
        if secret is None or not secret.startswith(API_KEY_PREFIX):
            return None
        api_key = api_key_authenticate(secret)
        if api_key is None:
            raise exceptions.AuthenticationFailed("Unknown, revoked or expired API key.")
        principal = Principal(organization=api_key.organization, api_key=api_key)
        return MachineUser(f"key:{api_key.pk}"), principal

    def authenticate_header(self, request):  # type: ignore[no-untyped-def]
        return 'Bearer realm="api"'


class SandboxTokenAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer <jwt>` minted for one sandbox."""

    def authenticate(self, request):  # type: ignore[no-untyped-def]
        token = _bearer(request)
        if token is None or not looks_like_jwt(token):
            return None
        principal = principal_from_sandbox_token(token)
        if principal is None:
            raise exceptions.AuthenticationFailed("The sandbox token is not valid or has expired.")
        return MachineUser(f"token:{principal.token.token_id}"), principal  # type: ignore[union-attr]

    def authenticate_header(self, request):  # type: ignore[no-untyped-def]
        return 'Bearer realm="api"'


def principal_from_sandbox_token(token: str) -> Principal | None:
    try:
        claims = sandbox_token_decode(token)
    except InvalidSandboxToken:
        return None
    organization = Organization.objects.filter(pk=claims.organization_id).first()
    if organization is None:
        return None
    return Principal(organization=organization, token=claims)


def principal_for_session_user(request: object) -> Principal | None:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return None
    organization = current_organization_for_session(request)
    if organization is None:
        return None
    membership = membership_get(user=user, organization=organization)
    return Principal(
        organization=organization, user=user, role=membership.role if membership else None
    )


class SessionAuthentication(authentication.SessionAuthentication):
    """Browser session (with CSRF), resolved to the session's current organization."""

    def authenticate(self, request):  # type: ignore[no-untyped-def]
        result = super().authenticate(request)
        if result is None:
            return None
        user, _ = result
        return user, principal_for_session_user(request._request)
