"""Sandbox reads. Every organization-owned lookup goes through here (tenancy in one place)."""

from __future__ import annotations

from django.db.models import F, Q, QuerySet

from accounts.authentication import Principal
from accounts.models import Organization
from common.errors import NotFound
from common.rows import RowLookup

from . import row_cache
from .models import Sandbox, Template


def sandbox_get_for_principal(
    *, principal: Principal, sandbox_id: str, with_organization: bool = True
) -> Sandbox:
    """The caller's sandbox. A miss, another organization's sandbox or a token minted for
    another sandbox all raise NotFound (never 403, which would confirm the id exists).

    `with_organization`: read the organization's row in the same statement and give it to
    the principal (a metered operation's billing reads its plan and cap). False for a read
    that needs only the sandbox: the joined row costs it ~0.15 ms of CPU. Either row, read
    before by this process, is served again once Redis confirmed it unchanged (row_cache)."""
    if not principal.allows_sandbox(sandbox_id):
        raise NotFound("No such sandbox.", code="sandbox_not_found")
    # By the organization's id: a principal may not have loaded the organization itself.
    sandbox = row_cache.sandbox_read(
        SANDBOX_WITH_ORGANIZATION if with_organization else SANDBOX_BY_ID_AND_ORGANIZATION,
        principal=principal,
        sandbox_id=sandbox_id,
    )
    if sandbox is None:
        raise NotFound("No such sandbox.", code="sandbox_not_found")
    if with_organization:
        principal.adopt_organization(sandbox.organization)
    return sandbox


SANDBOX_BY_ID_AND_ORGANIZATION = RowLookup(Sandbox, "pk", "organization")
"""`Sandbox.objects.get(pk=..., organization_id=...)`, written once (common/rows.py): every
sandbox request makes this lookup or the next (tests/sandboxes/test_sandbox_api.py compares
both with the ORM's)."""

SANDBOX_WITH_ORGANIZATION = RowLookup(Sandbox, "pk", "organization", join="organization")
"""The same with `select_related("organization")`: one round trip where billing would
otherwise read the organization in a query of its own (about 0.3 ms of CPU and a round
trip per command)."""


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


def templates_for_org(organization: Organization) -> QuerySet[Template]:
    """Built-in templates and the organization's own, built-ins first, then by name."""
    return Template.objects.filter(
        Q(organization__isnull=True) | Q(organization=organization)
    ).order_by(F("organization_id").asc(nulls_first=True), "name")


def template_get_for_org(*, organization: Organization, template_id: str) -> Template:
    """A template the organization may see (its own or a built-in); NotFound otherwise,
    never 403 (which would confirm another organization's id exists)."""
    template = templates_for_org(organization).filter(pk=template_id).first()
    if template is None:
        raise NotFound("No such template.", code="template_not_found")
    return template


def template_by_name(organization: Organization, name: str) -> Template | None:
    """The template a name (or id) means to the organization: its own before a built-in."""
    return (
        templates_for_org(organization)
        .filter(Q(name=name) | Q(pk=name))
        .order_by(F("organization_id").asc(nulls_last=True))
        .first()
    )
