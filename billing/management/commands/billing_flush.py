"""Flush recorded executions into the ledger now (what the flush_usage task does)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from billing import services


class Command(BaseCommand):
    help = "Move recorded executions from Redis (or loose ledger rows) into the daily rollup."

    def handle(self, *args: Any, **options: Any) -> None:
        result = services.usage_flush()
        self.stdout.write(f"read {result.read}, added {result.added}, skipped={result.skipped}")
