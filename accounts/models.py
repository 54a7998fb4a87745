"""Users, organizations, memberships, invitations and API keys.

An organization is the tenant: sandboxes, usage and invoices belong to it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from django.contrib.auth.base_user import BaseUserManager
from django.contrib.auth.models import AbstractUser
from django.db import models
from django.utils import timezone

from .signals import organizations_changed


class UserManager(BaseUserManager["User"]):
    use_in_migrations = True

    def _create_user(self, email: str, password: str | None, **extra: object) -> User:
        if not email:
            raise ValueError("An email address is required")
        user = self.model(email=self.normalize_email(email).lower(), **extra)
        user.set_password(password)
        user.save(using=self._db)
        return user

    def create_user(self, email: str, password: str | None = None, **extra: object) -> User:
        extra.setdefault("is_staff", False)
        extra.setdefault("is_superuser", False)
        return self._create_user(email, password, **extra)

    def create_superuser(self, email: str, password: str | None = None, **extra: object) -> User:
        extra["is_staff"] = True
        extra["is_superuser"] = True
        return self._create_user(email, password, **extra)


class User(AbstractUser):
    """A person. Logs in with email + password; `username` is not used."""

    # Django's documented way to drop an inherited field; the stubs know only the field.
    username = None  # type: ignore[assignment]
    email = models.EmailField("email address", unique=True)

    USERNAME_FIELD = "email"
    REQUIRED_FIELDS: ClassVar[list[str]] = []

    # Keyed by email: the stubs expect AbstractUser's username-keyed manager.
    objects = UserManager()  # type: ignore[assignment,misc]

    def __str__(self) -> str:
        return self.email


class Plan(models.TextChoices):
    FREE = "free", "Free"
    PREMIUM = "premium", "Premium"


class OrganizationQuerySet(models.QuerySet["Organization"]):
    def update(self, **kwargs: Any) -> int:
        count = super().update(**kwargs)
        if count:
            organizations_changed.send(sender=Organization, using=self.db)
        return count

    def delete(self) -> tuple[int, dict[str, int]]:
        deleted = super().delete()
        if deleted[0]:
            organizations_changed.send(sender=Organization, using=self.db)
        return deleted


class Organization(models.Model):
    """The tenant. Everything billable and every sandbox belongs to exactly one."""

    name = models.CharField(max_length=100)
    slug = models.SlugField(max_length=60, unique=True)
    plan = models.CharField(max_length=20, choices=Plan.choices, default=Plan.FREE)
    spending_cap_cents = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Hard monthly cap on the invoice total; empty = none."
    )
    max_concurrent_sandboxes = models.PositiveIntegerField(
        null=True, blank=True, help_text="Overrides SANDPIT_MAX_CONCURRENT_SANDBOXES when set."
    )
    allow_network = models.BooleanField(
        default=False, help_text="Sandboxes of this organization may ask for outbound network."
    )
    docker_runtime = models.CharField(
        max_length=20,
        blank=True,
        default="",
        choices=[("runc", "runc (container)"), ("runsc", "runsc (gVisor)")],
        help_text="Docker runtime for this organization's sandboxes; empty = "
        "SANDPIT_DOCKER_RUNTIME. runsc requires gVisor for every sandbox of the organization.",
    )
    created_at = models.DateTimeField(default=timezone.now)

    objects = OrganizationQuerySet.as_manager()

    def __str__(self) -> str:
        return self.slug


class Role(models.TextChoices):
    OWNER = "owner", "Owner"
    ADMIN = "admin", "Admin"
    MEMBER = "member", "Member"


MANAGER_ROLES = (Role.OWNER, Role.ADMIN)


class Membership(models.Model):
    """A user's role in one organization. Owners/admins manage; members use sandboxes."""

    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="memberships")
    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "organization"], name="one_membership_per_org")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.organization} ({self.role})"

    @property
    def can_manage(self) -> bool:
        return self.role in MANAGER_ROLES


class Invitation(models.Model):
    """A single-use, expiring link that adds its holder to an organization.

    Only a hash of the token is stored, so a database leak cannot be redeemed.
    """

    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="invitations"
    )
    email = models.EmailField()
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)
    token_hash = models.CharField(max_length=64, unique=True)
    created_by = models.ForeignKey(User, on_delete=models.SET_NULL, null=True, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(
        User, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"invitation for {self.email} to {self.organization}"


class ApiKey(models.Model):
    """An organization's API key. The secret is shown once; only its SHA-256 is kept.

    The secret is 32 random bytes, so a fast hash is enough (no brute force is
    feasible); `prefix` is the first characters of the secret, for lookup and display.
    """

    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="api_keys"
    )
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True)
    hashed_secret = models.CharField(max_length=64)
    created_by = models.ForeignKey(
        User, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    def is_active(self, now: datetime | None = None) -> bool:
        now = now or timezone.now()
        if self.revoked_at is not None:
            return False
        return not (self.expires_at is not None and self.expires_at <= now)
