from __future__ import annotations

from typing import TYPE_CHECKING

from rest_framework.permissions import BasePermission

from .authentication import Principal
from .models import User

if TYPE_CHECKING:  # rest_framework.views reads DEFAULT_PERMISSION_CLASSES, i.e. this module
    from rest_framework.request import Request
    from rest_framework.views import APIView


def principal_of(request: object) -> Principal:
    auth = getattr(request, "auth", None)
    assert isinstance(auth, Principal)
    return auth


def manager_of(request: object) -> User:
    """The person behind a request IsOrganizationManager let through: it refuses API keys and
    sandbox tokens (no user), so a signed-in owner or admin."""
    user = principal_of(request).user
    assert user is not None
    return user


def signed_in_user(request: object) -> User:
    """The signed-in user behind a request a login check let through (login_required,
    IsStaffUser, the admin site)."""
    user = getattr(request, "user", None)
    assert isinstance(user, User)
    return user


MACHINE_CREDENTIALS = frozenset({"ApiKey", "SandboxToken"})
"""The OpenAPI security schemes of credentials with no person behind them. A permission's
`refused_credentials` names the schemes it always refuses, so the schema lists for each
operation only the credentials it takes (playground/schema.py)."""


class HasOrganization(BasePermission):
    """Authenticated and resolved to an organization."""

    message = "Authentication credentials were not provided."

    def has_permission(self, request: Request, view: APIView) -> bool:
        return isinstance(getattr(request, "auth", None), Principal)


class IsSignedIn(BasePermission):
    """A person signed in with a browser session: never an API key or a sandbox token."""

    message = "Only a person signed in can do this, not an API key or a sandbox token."
    refused_credentials = MACHINE_CREDENTIALS

    def has_permission(self, request: Request, view: APIView) -> bool:
        auth = getattr(request, "auth", None)
        return isinstance(auth, Principal) and auth.user is not None


class IsOrganizationManager(BasePermission):
    """Owners and admins signed in with a browser session.

    Never an API key or a sandbox token, whoever created it: a key acts for the organization
    without a person to answer for a change (an invitation names who invited, a plan change
    who asked), and a key leaked from a CI job must not be able to invite a new owner, mint
    more keys or lift the spending cap. The refusal says so, rather than the role message
    an owner's own key would otherwise get."""

    message = "Only organization owners and admins can do this."
    refused_credentials = MACHINE_CREDENTIALS
    machine_message = (
        "API keys and sandbox tokens cannot manage the organization (members, invitations, "
        "API keys, plan, spending cap): an owner or admin does this signed in, in the browser "
        "(the Team and Billing pages), or through the API with that browser session."
    )

    def has_permission(self, request: Request, view: APIView) -> bool:
        auth = getattr(request, "auth", None)
        if isinstance(auth, Principal) and auth.user is None:
            self.message = self.machine_message
            return False
        return isinstance(auth, Principal) and auth.can_manage
