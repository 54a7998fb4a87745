"""Server-rendered pages. Each view authorizes, reads through a selector and renders;
the pages' JavaScript then talks to the REST API with the session."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from accounts.authentication import principal_for_session_user
from accounts.selectors import current_organization_for_session
from playground.errors import NotFound
from sandboxes import services as sandbox_services
from sandboxes.selectors import sandbox_get_for_principal
from sandboxes.serializers import SandboxOutput

from . import selectors

STATS_INTERVAL_MS = 5000


def _ws_route_exists(suffix: str) -> bool:
    """Whether the real-time layer serves a sandbox WebSocket route ending in `suffix`."""
    from sandboxes.routing import websocket_urlpatterns

    return any(
        str(getattr(p, "pattern", "")).rstrip("/$").endswith(suffix) for p in websocket_urlpatterns
    )


def staff_required(view):  # type: ignore[no-untyped-def]
    """Signed-in staff only: anonymous users go to the login page, others get a 403."""

    @login_required
    def wrapped(request: HttpRequest, *args, **kwargs):  # type: ignore[no-untyped-def]
        if not request.user.is_staff:
            raise PermissionDenied("Only Sandpit staff can see this page.")
        return view(request, *args, **kwargs)

    wrapped.__name__ = view.__name__
    wrapped.__doc__ = view.__doc__
    return wrapped


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "playground/dashboard.html",
        {"organization": current_organization_for_session(request), "nav": "sandboxes"},
    )


@login_required
def playground(request: HttpRequest, sandbox_id: str) -> HttpResponse:
    principal = principal_for_session_user(request)
    if principal is None:
        return redirect("dashboard")
    try:
        sandbox = sandbox_get_for_principal(principal=principal, sandbox_id=sandbox_id)
    except NotFound as exc:
        raise Http404("No such sandbox.") from exc
    exec_ws = f"/ws/sandboxes/{sandbox.id}/exec" if _ws_route_exists("/exec") else None
    return render(
        request,
        "playground/playground.html",
        {
            "sandbox": sandbox,
            "nav": "sandboxes",
            "page_data": {
                "sandbox": SandboxOutput(sandbox).data,
                "events_ws_path": f"/ws/sandboxes/{sandbox.id}/events",
                "exec_ws_path": exec_ws,
                "stats_interval_ms": STATS_INTERVAL_MS,
            },
        },
    )


@login_required
def team(request: HttpRequest) -> HttpResponse:
    principal = principal_for_session_user(request)
    return render(
        request,
        "playground/team.html",
        {
            "organization": principal.organization if principal else None,
            "can_manage": bool(principal and principal.can_manage),
            "role": principal.role if principal else None,
            "nav": "team",
        },
    )


@login_required
def billing(request: HttpRequest) -> HttpResponse:
    principal = principal_for_session_user(request)
    return render(
        request,
        "playground/billing.html",
        {
            "organization": principal.organization if principal else None,
            "can_manage": bool(principal and principal.can_manage),
            "nav": "billing",
        },
    )


@staff_required
def staff(request: HttpRequest) -> HttpResponse:
    hours = selectors.staff_executions_per_hour()
    providers = selectors.staff_provider_statuses()
    return render(
        request,
        "playground/staff.html",
        {
            "sandboxes": selectors.staff_live_sandboxes(),
            "providers": providers,
            "providers_ok": sum(1 for p in providers if p.ok),
            "usage": selectors.staff_usage_by_organization(),
            "hours_total": sum(b.executions for b in hours),
            "page_data": {
                "hours": [{"hour": b.hour.isoformat(), "executions": b.executions} for b in hours]
            },
            "idle_timeout_s": settings.SANDPIT_IDLE_TIMEOUT_S,
            "nav": "staff",
        },
    )


@require_POST
@staff_required
def staff_sandbox_kill(request: HttpRequest, sandbox_id: str) -> HttpResponse:
    """Destroy any organization's sandbox, recorded with reason "staff"."""
    sandbox = selectors.staff_sandbox_get(sandbox_id=sandbox_id)
    if sandbox is None:
        raise Http404("No such sandbox.")
    destroyed = sandbox_services.sandbox_destroy(sandbox=sandbox, reason="staff")
    if request.headers.get("Accept", "").startswith("application/json"):
        return JsonResponse({"id": sandbox.id, "destroyed": destroyed})
    if destroyed:
        messages.success(request, f"Killed {sandbox.id} ({sandbox.organization.name}).")
    else:
        messages.info(request, f"{sandbox.id} was already destroyed.")
    return redirect("staff")
