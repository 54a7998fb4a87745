from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from accounts.models import Organization
from accounts.services import api_key_create


class Command(BaseCommand):
    help = "Create an API key for an organization and print its secret on stdout."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("org_slug")
        parser.add_argument("name")

    def handle(self, *args: Any, **options: Any) -> None:
        organization = Organization.objects.filter(slug=options["org_slug"]).first()
        if organization is None:
            raise CommandError(f"No organization with slug '{options['org_slug']}'.")
        issued = api_key_create(organization=organization, name=options["name"])
        self.stdout.write(issued.secret)
