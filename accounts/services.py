"""Account side effects: organizations, members, invitations, API keys."""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.core import signing
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.text import slugify

from common.errors import ApplicationError, Conflict, Forbidden, NotFound

from .models import ApiKey, Invitation, Membership, Organization, Role, User

logger = logging.getLogger(__name__)

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


SIGNUP_LINK_MAX_AGE_S = 24 * 3600
_SIGNUP_SALT = "accounts.signup"


@dataclass(frozen=True)
class SignupRequest:
    """A signup waiting for its emailed link to be opened."""

    email: str
    organization_name: str
    next_url: str
    """Where to go after the account exists (an invitation, say); the view re-checks it."""


def signup_request(*, email: str, organization_name: str, next_url: str, base_url: str) -> None:
    """Mail `email` the link that finishes a signup, or, if the address already has an account,
    a note saying so with links to log in and reset the password.

    Both cases look alike to whoever submitted the form: only the address's owner learns which.
    The link carries a signed, timestamped payload (SIGNUP_LINK_MAX_AGE_S), not a database row,
    so a signup that is never confirmed leaves nothing behind and reserves no address.
    """
    email = email.strip().lower()
    if User.objects.filter(email__iexact=email).exists():
        send_mail(
            "Your Sandpit account",
            "Someone (hopefully you) tried to sign up to Sandpit with this address, which already "
            f"has an account.\n\nLog in: {base_url}/accounts/login/\n"
            f"Forgot your password? {base_url}/accounts/password_reset/\n\n"
            "If it was not you, you can ignore this mail.\n",
            None,
            [email],
        )
        return
    token = signing.dumps(
        {"e": email, "o": organization_name.strip(), "n": next_url},
        salt=_SIGNUP_SALT,
        compress=True,
    )
    send_mail(
        "Finish creating your Sandpit account",
        "Open this link to choose a password and create your Sandpit account "
        f"(valid for {SIGNUP_LINK_MAX_AGE_S // 3600} hours):\n\n"
        f"{base_url}/accounts/signup/confirm/{token}/\n\n"
        "If you did not ask for this, ignore this mail.\n",
        None,
        [email],
    )


def signup_request_read(token: str) -> SignupRequest:
    """The signup a confirmation link stands for. Raises ApplicationError `signup_link_invalid`
    when it was tampered with or is older than SIGNUP_LINK_MAX_AGE_S."""
    try:
        data = signing.loads(token, salt=_SIGNUP_SALT, max_age=SIGNUP_LINK_MAX_AGE_S)
        return SignupRequest(
            email=str(data["e"]), organization_name=str(data["o"]), next_url=str(data["n"])
        )
    except (signing.BadSignature, KeyError, TypeError):
        raise ApplicationError(
            "This link is not valid or has expired. Sign up again to get a new one.",
            code="signup_link_invalid",
        ) from None


def user_signup(
    *,
    email: str,
    password: str,
    organization_name: str | None = None,
    invitation_token: str | None = None,
) -> User:
    """Create a user, who joins the organization of `invitation_token` when that invitation is
    for this address and still open, or else gets a personal organization.

    Called once the address is confirmed (see signup_request), so an invitation is only ever
    redeemed by its own address. Raises Conflict `email_taken`.
    """
    email = email.strip().lower()
    if User.objects.filter(email__iexact=email).exists():
        raise Conflict("An account with this email already exists.", code="email_taken")
    with transaction.atomic():
        user = User.objects.create_user(email=email, password=password)
        if invitation_token:
            try:
                with transaction.atomic():
                    invitation_accept(token=invitation_token, user=user)
                return user
            except ApplicationError:
                pass  # another address's, revoked, used or expired: an ordinary signup
        organization_create(name=organization_name or email.split("@")[0], owner=user)
    return user


def membership_require_manager(*, user: User, organization: Organization) -> Membership:
    """The user's membership when they are owner/admin; raises Forbidden otherwise."""
    membership = Membership.objects.filter(user=user, organization=organization).first()
    if membership is None or not membership.can_manage:
        raise Forbidden("Only owners and admins can do this.", code="role_required")
    return membership


DOCKER_RUNTIMES = ("", "runc", "runsc")
"""Values of Organization.docker_runtime: '' follows SANDPIT_DOCKER_RUNTIME, 'runsc' requires
gVisor, 'runc' opts out of it."""


def organization_settings_set(
    *,
    actor: User,
    organization: Organization,
    allow_network: bool | None = None,
    docker_runtime: str | None = None,
) -> Organization:
    """Change the organization's sandbox policy; None leaves a setting as it is. Both apply
    to new sandboxes only (running ones keep what they were created with).

    `allow_network`: whether new sandboxes may ask for outbound network. `docker_runtime`:
    one of DOCKER_RUNTIMES ('runsc' puts every docker sandbox under gVisor and refuses the
    organization's sandboxes elsewhere). Owners only: network lets sandbox code reach the
    internet on the organization's behalf, and isolation is the owner's risk to choose.
    Raises Forbidden 'role_required', ApplicationError 'validation_error' for an unknown
    runtime, Conflict 'gvisor_unavailable' for 'runsc' where the docker provider is not
    enabled. Returns the organization as saved.
    """
    membership = Membership.objects.filter(user=actor, organization=organization).first()
    if membership is None or membership.role != Role.OWNER:
        raise Forbidden(
            "Only organization owners can change the network and isolation settings.",
            code="role_required",
        )
    changes: dict[str, object] = {}
    if allow_network is not None:
        changes["allow_network"] = allow_network
    if docker_runtime is not None:
        if docker_runtime not in DOCKER_RUNTIMES:
            raise ApplicationError(
                f"Unknown docker runtime '{docker_runtime}': use \"\" (the installation's "
                'default), "runc" or "runsc" (gVisor).',
                code="validation_error",
            )
        if docker_runtime == "runsc" and "docker" not in settings.SANDPIT_PROVIDERS:
            # Requiring gVisor here would refuse every sandbox the organization asks for.
            raise Conflict(
                "gVisor runs through the docker provider, which this installation does not "
                "enable (SANDPIT_PROVIDERS); ask an operator to enable it first.",
                code="gvisor_unavailable",
            )
        changes["docker_runtime"] = docker_runtime
    if changes:
        Organization.objects.filter(pk=organization.pk).update(**changes)
        for field, value in changes.items():
            setattr(organization, field, value)
    return organization


def membership_change_role(*, actor: User, membership: Membership, role: str) -> Membership:
    """Change a member's role; only owners may grant or take away ownership.

    Raises Forbidden (actor's role), Conflict `last_owner` (would leave no owner) or
    ApplicationError (unknown role). Returns the membership as saved.
    """
    if role not in Role.values:
        raise ApplicationError(f"Unknown role '{role}'.", code="validation_error")
    with transaction.atomic():
        membership, actor_membership = _lock_for_owner_change(actor=actor, membership=membership)
        if actor_membership is None or not actor_membership.can_manage:
            raise Forbidden("Only owners and admins can do this.", code="role_required")
        touches_owner = Role.OWNER in (role, membership.role)
        if touches_owner and actor_membership.role != Role.OWNER:
            raise Forbidden("Only owners can grant or remove the owner role.", code="role_required")
        if membership.role == Role.OWNER and role != Role.OWNER:
            _ensure_another_owner(membership)
        membership.role = role
        membership.save(update_fields=["role"])
    return membership


def membership_remove(*, actor: User, membership: Membership) -> None:
    """Remove a member, or let an owner/admin leave (actor is the member).

    Raises Forbidden (actor's role) or Conflict `last_owner` (would leave no owner).
    """
    with transaction.atomic():
        membership, actor_membership = _lock_for_owner_change(actor=actor, membership=membership)
        if actor_membership is None or not actor_membership.can_manage:
            raise Forbidden("Only owners and admins can do this.", code="role_required")
        if membership.role == Role.OWNER:
            if actor_membership.role != Role.OWNER:
                raise Forbidden("Only owners can remove an owner.", code="role_required")
            _ensure_another_owner(membership)
        membership.delete()


def _lock_for_owner_change(
    *, actor: User, membership: Membership
) -> tuple[Membership, Membership | None]:
    """Lock the organization row, then re-read both memberships under that lock.

    Every change that can take away an owner goes through here, so two owners demoting or
    removing each other at the same moment run one after the other: the second sees the
    first's write and is refused, instead of both passing the owner count and leaving none.
    Must be called inside a transaction. Raises NotFound if the membership is gone.
    """
    Organization.objects.select_for_update().only("pk").get(pk=membership.organization_id)
    current = Membership.objects.filter(pk=membership.pk).select_related("organization").first()
    if current is None:
        raise NotFound("No such member.", code="not_found")
    actor_membership = Membership.objects.filter(
        user=actor, organization_id=membership.organization_id
    ).first()
    return current, actor_membership


def _ensure_another_owner(membership: Membership) -> None:
    others = Membership.objects.filter(
        organization_id=membership.organization_id, role=Role.OWNER
    ).exclude(pk=membership.pk)
    if not others.exists():
        raise Conflict("An organization needs at least one owner.", code="last_owner")


# --- invitations --------------------------------------------------------------------


@dataclass(frozen=True)
class IssuedInvitation:
    invitation: Invitation
    token: str
    """The secret part of the link; shown once."""
    emailed: bool = False
    """Whether the mail with the link went out (False: not asked to, or the mail server failed;
    the link can still be shared by hand)."""


def invitation_path(token: str) -> str:
    return f"/invitations/{token}/"


def _invitation_mail(*, invitation: Invitation, token: str, actor: User, base_url: str) -> bool:
    """Mail the invitation's link to the invited address. False when the mail server refused."""
    organization = invitation.organization
    try:
        send_mail(
            f"{actor.email} invited you to {organization.name} on Sandpit",
            f"{actor.email} invited you to join the organization {organization.name} on Sandpit "
            f"as {invitation.get_role_display().lower()}.\n\n"
            f"Accept the invitation: {base_url}{invitation_path(token)}\n\n"
            "No Sandpit account yet? Open the link and create one with this address "
            f"({invitation.email}); you join {organization.name} as soon as it exists.\n"
            f"The link works once, until {invitation.expires_at:%Y-%m-%d %H:%M} UTC.\n",
            None,
            [invitation.email],
        )
    except Exception:  # noqa: BLE001 - the invitation stands; the manager can share the link
        logger.warning("mailing invitation %s failed", invitation.pk, exc_info=True)
        return False
    return True


def invitation_create(
    *,
    actor: User,
    organization: Organization,
    email: str,
    role: str = Role.MEMBER,
    base_url: str | None = None,
) -> IssuedInvitation:
    """Create a single-use invitation link valid for INVITATION_TTL_HOURS and, given the site's
    `base_url`, mail it to the invited address (through EMAIL_BACKEND)."""
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
    emailed = bool(base_url) and _invitation_mail(
        invitation=invitation, token=token, actor=actor, base_url=str(base_url)
    )
    return IssuedInvitation(invitation=invitation, token=token, emailed=emailed)


def invitation_resend(*, actor: User, invitation: Invitation, base_url: str) -> IssuedInvitation:
    """Mail a pending invitation again, with a new link and a new expiry; the old link stops
    working (only a hash of a link is kept, so the old one cannot be sent again).

    Raises Forbidden (not a manager), Conflict `invitation_not_pending` (accepted or revoked).
    """
    membership_require_manager(user=actor, organization=invitation.organization)
    token = secrets.token_urlsafe(32)
    with transaction.atomic():
        locked = Invitation.objects.select_for_update().get(pk=invitation.pk)
        if locked.accepted_at is not None or locked.revoked_at is not None:
            raise Conflict(
                "Only a pending invitation can be sent again.", code="invitation_not_pending"
            )
        locked.token_hash = _sha256(token)
        locked.expires_at = timezone.now() + timedelta(hours=settings.INVITATION_TTL_HOURS)
        locked.save(update_fields=["token_hash", "expires_at"])
    emailed = _invitation_mail(invitation=locked, token=token, actor=actor, base_url=base_url)
    return IssuedInvitation(invitation=locked, token=token, emailed=emailed)


def invitation_get_by_token(token: str) -> Invitation:
    invitation = (
        Invitation.objects.select_related("organization").filter(token_hash=_sha256(token)).first()
    )
    if invitation is None:
        raise NotFound("This invitation link is not valid.", code="invitation_invalid")
    return invitation


# Says nothing about the invitation (organization, role, address, state): the link may have
# been forwarded to, or guessed by, someone it was not meant for.
INVITATION_WRONG_ACCOUNT = (
    "This invitation is for a different account. Log in with the email address it was sent to."
)


def invitation_is_for(invitation: Invitation, user: User) -> bool:
    """Whether `user`'s email is the invited one (case-insensitive).

    An account's email is verified: signup creates the account only from the emailed
    confirmation link, and staff create the others.
    """
    return bool(user.email) and user.email.strip().lower() == invitation.email.strip().lower()


def invitation_accept(*, token: str, user: User) -> Membership:
    """Redeem an invitation once, for the account whose email it was sent to.

    Raises NotFound (unknown link), Forbidden `invitation_wrong_account` (another account; checked
    before anything that would tell the link's state), Conflict (revoked, used, expired).
    """
    with transaction.atomic():
        invitation = (
            Invitation.objects.select_for_update().filter(token_hash=_sha256(token)).first()
        )
        if invitation is None:
            raise NotFound("This invitation link is not valid.", code="invitation_invalid")
        if not invitation_is_for(invitation, user):
            raise Forbidden(INVITATION_WRONG_ACCOUNT, code="invitation_wrong_account")
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


def invitation_joined(*, token: str | None, user: User) -> Organization | None:
    """The organization `user` joined by redeeming the invitation `token`, or None."""
    if not token:
        return None
    invitation = (
        Invitation.objects.select_related("organization")
        .filter(token_hash=_sha256(token), accepted_by=user)
        .first()
    )
    return invitation.organization if invitation else None


def invitation_revoke(*, actor: User, invitation: Invitation) -> None:
    """Cancel a pending invitation: its link stops working. Accepted ones are left as they are.
    Raises Forbidden for non-managers."""
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
