"""Every kind of write to an organization's row, for the tests of the caches that keep it
(accounts/orgcache.py, and sandboxes/row_cache.py's operation entries): each changes at least
one of FIELDS."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from accounts import services as accounts_services
from accounts.models import Organization
from billing import services as billing_services

FIELDS = ("name", "plan", "spending_cap_cents", "max_concurrent_sandboxes", "allow_network")


def values(organization: Organization) -> list[Any]:
    return [getattr(organization, name) for name in FIELDS]


def cap_set(organization: Organization) -> None:
    """A spending cap of 0: every metered call of a premium organization is refused."""
    billing_services.organization_spending_cap_set(organization=organization, cap_cents=0)


def _settings_set(organization: Organization) -> None:
    accounts_services.organization_settings_set(
        actor=organization.memberships.get(role="owner").user,
        organization=organization,
        allow_network=True,
    )


def _save(organization: Organization) -> None:
    organization.name = "Renamed"
    organization.save()


def _queryset_update(organization: Organization) -> None:
    Organization.objects.filter(pk=organization.pk).update(max_concurrent_sandboxes=3)


def _bulk_update(organization: Organization) -> None:
    organization.plan = "free"
    Organization.objects.bulk_update([organization], ["plan"])


WRITES: dict[str, Callable[[Organization], None]] = {
    "save": _save,
    "spending-cap": cap_set,
    "settings": _settings_set,
    "queryset-update": _queryset_update,
    "bulk-update": _bulk_update,
}
