from __future__ import annotations

from rest_framework.permissions import BasePermission

from .authentication import Principal


def principal_of(request: object) -> Principal:
    auth = getattr(request, "auth", None)
    assert isinstance(auth, Principal)
    return auth


class HasOrganization(BasePermission):
    """Authenticated and resolved to an organization."""

    message = "Authentication credentials were not provided."

    def has_permission(self, request, view):  # type: ignore[no-untyped-def]
        return isinstance(getattr(request, "auth", None), Principal)


class IsOrganizationManager(BasePermission):
    """Owners and admins signed in with a browser session."""

    message = "Only organization owners and admins can do this."

    def has_permission(self, request, view):  # type: ignore[no-untyped-def]
        auth = getattr(request, "auth", None)
        return isinstance(auth, Principal) and auth.can_manage
