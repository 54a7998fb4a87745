"""The caller of a request, resolved to one organization (see accounts.authentication).

Its own module so the rate limiter (accounts.throttling) can name it while authentication
imports the rate limiter: one Redis round trip both counts a request and confirms a cached
API key (accounts.keycache)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import orgcache
from .models import MANAGER_ROLES, ApiKey, Organization, User
from .tokens import SandboxTokenClaims


@dataclass(frozen=True)
class RateVerdict:
    """The rate limiter's answer, when authentication already counted the request in the
    round trip that confirmed its cached key (the throttle then asks Redis nothing)."""

    bucket: str
    """The throttle's cache key the request was counted in."""
    allowed: bool
    wait_s: float | None = None
    """Seconds until a refused request would be admitted (Retry-After)."""


class Principal:
    """The caller, resolved to one organization.

    `organization` is loaded on first use when only its id is known (an API key confirmed
    from the per-process cache): a read that needs only the id, such as a sandbox lookup,
    makes no query for it, and a view that does use it gets the current row (from this
    process's copy while Redis confirms no organization changed: accounts/orgcache.py)."""

    def __init__(
        self,
        organization: Organization | None = None,
        user: User | None = None,
        api_key: ApiKey | None = None,
        token: SandboxTokenClaims | None = None,
        role: str | None = None,
        extra: dict[str, object] | None = None,
        *,
        organization_id: int | None = None,
        rate: RateVerdict | None = None,
        read: Mapping[str, Any] | None = None,
    ) -> None:
        if organization is not None:
            organization_id = organization.pk
        elif organization_id is None:
            raise TypeError("Principal needs an organization or its id")
        self._organization = organization
        self.organization_id: int = organization_id
        self.user = user
        self.api_key = api_key
        self.token = token
        self.role = role
        """Membership role for session callers; None for keys and tokens."""
        self.extra: dict[str, object] = extra if extra is not None else {}
        self.rate = rate
        self._read = dict(read or {})
        """Redis values read in the authentication's round trip (accounts/
        authentication_reads.py), by key, until taken."""

    def __repr__(self) -> str:
        who = self.api_key or self.user or (self.token and self.token.token_id)
        return f"Principal(organization_id={self.organization_id}, caller={who!r})"

    @property
    def organization(self) -> Organization:
        if self._organization is None:
            organization = orgcache.organization_read(self)
            if organization is None:
                raise Organization.DoesNotExist("Organization matching query does not exist.")
            self._organization = organization
        return self._organization

    def adopt_organization(self, organization: Organization) -> None:
        """Use a row of the caller's organization read with another (a sandbox's lookup
        joins it) instead of querying for it on first use. Another organization's row is
        ignored."""
        if self._organization is None and organization.pk == self.organization_id:
            self._organization = organization

    def take_values(self, keys: Sequence[str]) -> list[Any] | None:
        """The values of `keys` read in the authentication's round trip, once: None when
        any of them was not read there (or was taken already), so the caller reads Redis
        itself. Once, because a request that counts an execution and then checks again
        must see its own count."""
        if not keys or any(key not in self._read for key in keys):
            return None
        return [self._read.pop(key) for key in keys]

    @property
    def can_manage(self) -> bool:
        return self.role in MANAGER_ROLES

    def allows_sandbox(self, sandbox_id: str) -> bool:
        return self.token is None or self.token.sandbox_id == str(sandbox_id)

    def has_scope(self, scope: str) -> bool:
        return self.token is None or scope in self.token.scopes


class MachineUser:
    """request.user for key/token callers: authenticated, never staff."""

    is_authenticated = True
    is_anonymous = False
    is_staff = False
    is_superuser = False

    def __init__(self, ident: str) -> None:
        self.pk = ident
        self.id = ident

    def __str__(self) -> str:
        return self.pk
