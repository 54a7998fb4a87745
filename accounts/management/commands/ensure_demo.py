from __future__ import annotations

import os

from django.core.management.base import BaseCommand

from accounts.models import Membership, Organization, Role, User


class Command(BaseCommand):
    help = "Make sure the demo organization and user exist, and print their credentials."

    def handle(self, *args, **options):  # type: ignore[no-untyped-def]
        email = os.environ.get("SANDPIT_DEMO_EMAIL", "demo@sandpit.local")
        password = os.environ.get("SANDPIT_DEMO_PASSWORD", "sandpit-demo")
        user = User.objects.filter(email=email).first()
        if user is None:
            user = User.objects.create_user(email=email, password=password, is_staff=True)
        else:
            user.set_password(password)
            user.save(update_fields=["password"])
        org, _ = Organization.objects.get_or_create(slug="demo", defaults={"name": "Demo"})
        Membership.objects.get_or_create(user=user, organization=org, defaults={"role": Role.OWNER})
        self.stdout.write(
            f"Demo login: {email} / {password} (organization 'demo') at http://127.0.0.1:8000/"
        )
