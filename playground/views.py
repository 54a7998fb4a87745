"""Server-rendered pages. Each view authorizes, reads through a selector and renders;
the pages' JavaScript then talks to the REST API with the session."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from accounts.authentication import Principal, principal_for_session_user
from accounts.selectors import current_organization_for_session, organization_manager_emails
from billing import pricing
from common.errors import NotFound
from sandboxes import file_services
from sandboxes import services as sandbox_services
from sandboxes.models import Sandbox
from sandboxes.selectors import sandbox_get_for_principal
from sandboxes.serializers import SandboxOutput, file_entry_data

from . import selectors

logger = logging.getLogger(__name__)

STATS_INTERVAL_MS = 5000


def plan_offer(principal: Principal) -> dict[str, object]:
    """What a page shows where the plan blocks a feature: managers get an upgrade button with
    the price, members the names of whom to ask. Prices come from billing/pricing.py."""
    return {
        "plan": principal.organization.plan,
        "can_upgrade": bool(principal.can_manage),
        "managers": organization_manager_emails(principal.organization),
        "premium_price": pricing.format_cents(pricing.PREMIUM_BASE_CENTS),
        "premium_included": pricing.PREMIUM_INCLUDED_EXECUTIONS,
        "overage_per_100k": pricing.format_cents(
            int(pricing.OVERAGE_CENTS_PER_EXECUTION * 100_000)
        ),
    }


def _initial_listing(sandbox: Sandbox) -> list[dict[str, object]] | None:
    """The workspace's top level, rendered with the page: the page's own first look at the
    files is part of opening it, not an operation the person asked for, so it is not metered
    (the explorer lists through the API only when someone refreshes or opens a folder)."""
    if sandbox.state != "running":
        return None
    try:
        entries = file_services.sandbox_file_list(
            caller=sandbox_services.PLATFORM, sandbox=sandbox, path="."
        )
    except Exception:  # noqa: BLE001 - the page still opens; the explorer then lists by itself
        logger.info("initial listing of %s failed", sandbox.id, exc_info=True)
        return None
    return [file_entry_data(entry) for entry in entries]


def staff_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Signed-in staff only: anonymous users go to the login page, others get a 403."""

    @login_required
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
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
    return render(
        request,
        "playground/playground.html",
        {
            "sandbox": sandbox,
            "nav": "sandboxes",
            "page_data": {
                "sandbox": SandboxOutput(sandbox).data,
                "events_ws_path": f"/ws/sandboxes/{sandbox.id}/events",
                "exec_ws_path": f"/ws/sandboxes/{sandbox.id}/exec",
                "stats_interval_ms": STATS_INTERVAL_MS,
                "files": _initial_listing(sandbox),
                "plan": plan_offer(principal),
            },
        },
    )


@login_required
def templates(request: HttpRequest) -> HttpResponse:
    """The organization's templates: list, create form, build progress and live log."""
    principal = principal_for_session_user(request)
    return render(
        request,
        "playground/templates.html",
        {
            "organization": principal.organization if principal else None,
            "is_owner": bool(principal and principal.role == "owner"),
            "nav": "templates",
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
            "plan_offer": plan_offer(principal) if principal else None,
            "pricing": {
                "free_allowance": f"{settings.SANDPIT_FREE_MONTHLY_EXECUTIONS:,}",
                "premium_price": pricing.format_cents(pricing.PREMIUM_BASE_CENTS),
                "premium_included": f"{pricing.PREMIUM_INCLUDED_EXECUTIONS:,}",
            },
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
