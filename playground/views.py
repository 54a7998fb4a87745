"""Server-rendered pages."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from accounts.selectors import current_organization_for_session


@login_required
def dashboard(request):  # type: ignore[no-untyped-def]
    return render(
        request,
        "playground/dashboard.html",
        {"organization": current_organization_for_session(request)},
    )


@login_required
def team(request):  # type: ignore[no-untyped-def]
    return render(
        request,
        "playground/team.html",
        {"organization": current_organization_for_session(request)},
    )
