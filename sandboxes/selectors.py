"""Sandbox reads. Every organization-owned lookup goes through here (tenancy in one place)."""

from __future__ import annotations

from django.db.models import QuerySet

from accounts.authentication import Principal
from accounts.models import Organization
from playground.errors import NotFound

from .models import Sandbox


def sandbox_get_for_principal(*, principal: Principal, sandbox_id: str) -> Sandbox:
    """The caller's sandbox. A miss, another organization's sandbox or a token minted for
    another sandbox all raise NotFound (never 403, which would confirm the id exists)."""
    if not principal.allows_sandbox(sandbox_id):
        raise NotFound("No such sandbox.", code="sandbox_not_found")
    try:
        return Sandbox.objects.get(pk=sandbox_id, organization=principal.organization)
    except Sandbox.DoesNotExist:
        raise NotFound("No such sandbox.", code="sandbox_not_found") from None


def sandboxes_for_org(
    organization: Organization, *, include_destroyed: bool = False, state: str | None = None
) -> QuerySet[Sandbox]:
    """The organization's sandboxes, newest first: in `state`, else all but destroyed ones
    (unless `include_destroyed`)."""
    qs = Sandbox.objects.filter(organization=organization)
    if state:
        qs = qs.filter(state=state)
    elif not include_destroyed:
        qs = qs.exclude(state="destroyed")
    return qs.order_by("-created_at")
