"""Account reads."""

from __future__ import annotations

from django.db.models import QuerySet

from common.errors import NotFound
from common.rows import RowLookup

from .models import MANAGER_ROLES, ApiKey, Invitation, Membership, Organization, Role, User


def organizations_for_user(user: User) -> QuerySet[Organization]:
    return Organization.objects.filter(memberships__user=user).order_by("name")


def membership_get(*, user: User, organization: Organization) -> Membership | None:
    return Membership.objects.filter(user=user, organization=organization).first()


def current_organization_for_session(request: object) -> Organization | None:
    """The organization the browser session works in: the chosen one if still a member,
    else the user's first organization."""
    membership = current_membership_for_session(request)
    return membership.organization if membership is not None else None


def current_membership_for_session(request: object) -> Membership | None:
    """The session user's membership of `current_organization_for_session`'s organization,
    read with it in one statement (a session's every API request needs both: the
    organization, and the role)."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return None
    session = getattr(request, "session", None)
    chosen_id = session.get("organization_id") if session is not None else None
    if isinstance(chosen_id, int):
        chosen = MEMBERSHIP_WITH_ORGANIZATION.get(user.pk, chosen_id)
        if chosen is not None:
            return chosen
    return FIRST_MEMBERSHIP_WITH_ORGANIZATION.get(user.pk)


MEMBERSHIP_WITH_ORGANIZATION = RowLookup(Membership, "user", "organization", join="organization")
"""A user's membership of one organization, with the organization (one at most: a unique
pair). Statements written once (common/rows.py): a browser session's every request reads
one of these two, which the ORM compiled each time (~1.3 ms of the request's CPU here)."""

FIRST_MEMBERSHIP_WITH_ORGANIZATION = RowLookup(
    Membership, "user", join="organization", first_by=("organization__name", "organization")
)
"""A user's first membership by the organization's name (then id), with the organization."""


def api_keys_for_org(organization: Organization) -> QuerySet[ApiKey]:
    return (
        ApiKey.objects.filter(organization=organization)
        .select_related("created_by")
        .order_by("-created_at")
    )


def organization_manager_emails(organization: Organization) -> list[str]:
    """Emails of the owners and admins (owners first): whom a member asks about the plan."""
    memberships = Membership.objects.filter(
        organization=organization, role__in=MANAGER_ROLES
    ).select_related("user")
    ordered = sorted(memberships, key=lambda m: (m.role != Role.OWNER, m.user.email))
    return [m.user.email for m in ordered]


def invitation_get_for_org(*, organization: Organization, invitation_id: int) -> Invitation:
    """One of `organization`'s invitations. Raises NotFound for any other id (never 403)."""
    invitation = (
        Invitation.objects.select_related("organization")
        .filter(organization=organization, pk=invitation_id)
        .first()
    )
    if invitation is None:
        raise NotFound("No such invitation.", code="not_found")
    return invitation
