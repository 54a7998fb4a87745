"""Issue invoices for one closed period (YYYY-MM), or the previous period by default."""

from __future__ import annotations

from datetime import date
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from accounts.models import Organization
from billing import pricing, services


class Command(BaseCommand):
    help = "Close a billing period: one invoice per premium organization (idempotent)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--period", help="YYYY-MM; default: the previous month (UTC)")

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["period"]:
            invoices = services.billing_periods_close()
        else:
            try:
                year, month = (int(part) for part in options["period"].split("-"))
                start = date(year, month, 1)
            except ValueError as exc:
                raise CommandError("--period must look like 2025-01") from exc
            if pricing.period_bounds(start)[1] > timezone.now():
                raise CommandError("that period has not ended yet")
            services.usage_flush()
            invoices = [
                invoice
                for org in Organization.objects.all()
                if (invoice := services.invoice_close_period(organization=org, start=start))
            ]
        for invoice in invoices:
            self.stdout.write(
                f"{invoice.organization_id} {invoice.period_start:%Y-%m} "
                f"{pricing.format_cents(invoice.total_cents)} {invoice.status}"
            )
