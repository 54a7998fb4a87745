from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from .selectors import current_organization_for_session, organizations_for_user


def current_organization(request: HttpRequest) -> dict[str, Any]:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {
        "current_organization": current_organization_for_session(request),
        "user_organizations": list(organizations_for_user(user)),
    }
