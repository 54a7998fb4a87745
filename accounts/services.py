"""Account side effects: organizations, members, invitations, API keys."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.text import slugify

from playground.errors import ApplicationError, Conflict, Forbidden, NotFound

from .models import ApiKey, Invitation, Membership, Organization, Role, User

API_KEY_PREFIX = "sp_"
_LOOKUP_CHARS = 8  # characters after "sp_" kept in clear for lookup and display


def _sha256(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


# --- organizations and members ------------------------------------------------


def organization_create(*, name: str, owner: User, slug: str | None = None) -> Organization:
    """Create an organization with `owner` as its owner. Raises Conflict on a taken slug."""
    base = slugify(slug or name)[:50] or "org"
    candidate = base
    for attempt in range(1, 50):
        try:
            with transaction.atomic():
                org = Organization.objects.create(name=name, slug=candidate)
                Membership.objects.create(user=owner, organization=org, role=Role.OWNER)
                return org
        except IntegrityError:
            if slug:
                raise Conflict(f"The slug '{slug}' is taken.") from None
            candidate = f"{base}-{attempt + 1}"
    raise Conflict("Could not find a free slug for this organization.")


def user_signup(*, email: str, password: str, organization_name: str | None = None) -> User:
    """Create a user and, unless they join by invitation later, a personal organization."""
    email = email.strip().lower()
    if User.objects.filter(email__iexact=email).exists():
        raise Conflict("An account with this email already exists.", code="email_taken")
    with transaction.atomic():
        user = User.objects.create_user(email=email, password=password)
        organization_create(name=organization_name or email.split("@")[0], owner=user)
    return user


def membership_require_manager(*, user: User, organization: Organization) -> Membership:
    """The user's membership when they are owner/admin; raises Forbidden otherwise."""
    membership = Membership.objects.filter(user=user, organization=organization).first()
    if membership is None or not membership.can_manage:
        raise Forbidden("Only owners and admins can do this.", code="role_required")
    return membership


def membership_change_role(*, actor: User, membership: Membership, role: str) -> Membership:
    """Change a member's role; only owners may grant or take away ownership."""
    actor_membership = membership_require_manager(user=actor, organization=membership.organization)
    if role not in Role.values:
        raise ApplicationError(f"Unknown role '{role}'.", code="validation_error")
    touches_owner = Role.OWNER in (role, membership.role)
    if touches_owner and actor_membership.role != Role.OWNER:
        raise Forbidden("Only owners can grant or remove the owner role.", code="role_required")
    if membership.role == Role.OWNER and role != Role.OWNER:
        _ensure_another_owner(membership)
    membership.role = role
    membership.save(update_fields=["role"])
    return membership


def membership_remove(*, actor: User, membership: Membership) -> None:
    actor_membership = membership_require_manager(user=actor, organization=membership.organization)
    if membership.role == Role.OWNER:
        if actor_membership.role != Role.OWNER:
            raise Forbidden("Only owners can remove an owner.", code="role_required")
        _ensure_another_owner(membership)
    membership.delete()


def _ensure_another_owner(membership: Membership) -> None:
    others = Membership.objects.filter(
        organization=membership.organization, role=Role.OWNER
    ).exclude(pk=membership.pk)
    if not others.exists():
        raise Conflict("An organization needs at least one owner.", code="last_owner")


# --- invitations --------------------------------------------------------------------


@dataclass(frozen=True)
class IssuedInvitation:
    invitation: Invitation
    token: str
    """The secret part of the link; shown once."""


def invitation_create(
    *, actor: User, organization: Organization, email: str, role: str = Role.MEMBER
) -> IssuedInvitation:
    """Create a single-use invitation link valid for INVITATION_TTL_HOURS."""
    actor_membership = membership_require_manager(user=actor, organization=organization)
    if role == Role.OWNER and actor_membership.role != Role.OWNER:
        raise Forbidden("Only owners can invite owners.", code="role_required")
    if role not in Role.values:
        raise ApplicationError(f"Unknown role '{role}'.", code="validation_error")
    token = secrets.token_urlsafe(32)
    invitation = Invitation.objects.create(
        organization=organization,
        email=email.strip().lower(),
        role=role,
        token_hash=_sha256(token),
        created_by=actor,
        expires_at=timezone.now() + timedelta(hours=settings.INVITATION_TTL_HOURS),
    )
    return IssuedInvitation(invitation=invitation, token=token)


def invitation_get_by_token(token: str) -> Invitation:
    invitation = (
        Invitation.objects.select_related("organization").filter(token_hash=_sha256(token)).first()
    )
    if invitation is None:
        raise NotFound("This invitation link is not valid.", code="invitation_invalid")
    return invitation


def invitation_accept(*, token: str, user: User) -> Membership:
    """Redeem an invitation once. Raises on expired, used or revoked links."""
    with transaction.atomic():
        invitation = (
            Invitation.objects.select_for_update().filter(token_hash=_sha256(token)).first()
        )
        if invitation is None:
            raise NotFound("This invitation link is not valid.", code="invitation_invalid")
        if invitation.revoked_at is not None:
            raise Conflict("This invitation was revoked.", code="invitation_revoked")
        if invitation.accepted_at is not None:
            raise Conflict("This invitation was already used.", code="invitation_used")
        if invitation.expires_at <= timezone.now():
            raise Conflict("This invitation has expired.", code="invitation_expired")
        membership, created = Membership.objects.get_or_create(
            user=user, organization=invitation.organization, defaults={"role": invitation.role}
        )
        invitation.accepted_at = timezone.now()
        invitation.accepted_by = user
        invitation.save(update_fields=["accepted_at", "accepted_by"])
    return membership


def invitation_revoke(*, actor: User, invitation: Invitation) -> None:
    membership_require_manager(user=actor, organization=invitation.organization)
    if invitation.revoked_at is None and invitation.accepted_at is None:
        invitation.revoked_at = timezone.now()
        invitation.save(update_fields=["revoked_at"])


# --- API keys --------------------------------------------------------------------------


@dataclass(frozen=True)
class IssuedApiKey:
    api_key: ApiKey
    secret: str
    """The full key, `sp_<lookup><secret>`; shown exactly once."""


def api_key_create(
    *,
    organization: Organization,
    name: str,
    created_by: User | None = None,
    expires_at: datetime | None = None,
) -> IssuedApiKey:
    """Mint a key. Callers check the role; management commands call this directly."""
    name = name.strip()
    if not name:
        raise ApplicationError("A key needs a name.", code="validation_error")
    for _ in range(5):
        lookup = secrets.token_hex(_LOOKUP_CHARS // 2)
        secret = f"{API_KEY_PREFIX}{lookup}{secrets.token_urlsafe(32)}"
        try:
            api_key = ApiKey.objects.create(
                organization=organization,
                name=name[:100],
                prefix=lookup,
                hashed_secret=_sha256(secret),
                created_by=created_by,
                expires_at=expires_at,
            )
            return IssuedApiKey(api_key=api_key, secret=secret)
        except IntegrityError:
            continue
    raise Conflict("Could not allocate a unique key prefix; try again.")


def api_key_revoke(*, api_key: ApiKey) -> ApiKey:
    """Revoke; idempotent."""
    if api_key.revoked_at is None:
        api_key.revoked_at = timezone.now()
        api_key.save(update_fields=["revoked_at"])
    return api_key


def api_key_authenticate(secret: str) -> ApiKey | None:
    """The active key for a presented secret, or None. Constant-time hash compare."""
    if (
        not secret.startswith(API_KEY_PREFIX)
        or len(secret) < len(API_KEY_PREFIX) + _LOOKUP_CHARS + 8
    ):
        return None
    lookup = secret[len(API_KEY_PREFIX) : len(API_KEY_PREFIX) + _LOOKUP_CHARS]
    try:  # get(), not first(): the prefix is unique, so no ORDER BY to build (on every request)
        api_key = ApiKey.objects.select_related("organization").get(prefix=lookup)
    except ApiKey.DoesNotExist:
        return None
    if not hmac.compare_digest(api_key.hashed_secret, _sha256(secret)):
        return None
    now = timezone.now()
    if not api_key.is_active(now):
        return None
    # Touch last_used at most once a minute: a write per request would serialize keys.
    if api_key.last_used_at is None or now - api_key.last_used_at > timedelta(seconds=60):
        ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=now)
        api_key.last_used_at = now
    return api_key
