from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from accounts.models import Membership, Organization, Role, User
from billing import pricing
from billing.models import PlanChange
from billing.services import organization_plan_change


def local_url() -> str:
    """The address `make run` serves on, as a browser on this machine reaches it."""
    host = settings.SANDPIT_BIND
    if host in {"0.0.0.0", "::", ""}:  # noqa: S104 - naming the wildcard, not binding to it
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{settings.SANDPIT_PORT}/"


class Command(BaseCommand):
    help = "Make sure the demo organization and user exist, and print their credentials."

    def handle(self, *args: Any, **options: Any) -> None:
        email = settings.SANDPIT_DEMO_EMAIL
        password = settings.SANDPIT_DEMO_PASSWORD
        user = User.objects.filter(email=email).first()
        if user is None:
            user = User.objects.create_user(email=email, password=password, is_staff=True)
        else:
            user.set_password(password)
            user.save(update_fields=["password"])
        org, _ = Organization.objects.get_or_create(slug="demo", defaults={"name": "Demo"})
        Membership.objects.get_or_create(user=user, organization=org, defaults={"role": Role.OWNER})
        # The demo organization is the operator's own: a first run shows every feature. A plan
        # someone chose since (any recorded change) is left alone.
        if org.plan != pricing.PREMIUM and not PlanChange.objects.filter(organization=org).exists():
            organization_plan_change(organization=org, plan=pricing.PREMIUM, requested_by=None)
        self.stdout.write(
            f"Demo login: {email} / {password} (organization 'demo', {org.plan} plan) at {local_url()}"
        )
