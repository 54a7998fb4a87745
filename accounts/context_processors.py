from __future__ import annotations

from .selectors import current_organization_for_session, organizations_for_user


def current_organization(request):  # type: ignore[no-untyped-def]
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {
        "current_organization": current_organization_for_session(request),
        "user_organizations": list(organizations_for_user(user)),
    }
