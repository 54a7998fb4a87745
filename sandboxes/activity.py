"""Activity time of a sandbox (the idle reaper reads it), shared by the services and the
terminal registry so neither has to import the other."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from .models import Sandbox

ACTIVITY_WRITE_INTERVAL_S = 5  # coalesce activity writes so busy sandboxes do not contend


def sandbox_touch(sandbox: Sandbox) -> None:
    """Record activity (for the idle reaper); at most one write per few seconds."""
    now = timezone.now()
    threshold = now - timedelta(seconds=ACTIVITY_WRITE_INTERVAL_S)
    if sandbox.last_activity_at >= threshold:
        return  # the row we just read is fresh enough: no write, no round trip
    Sandbox.objects.filter(last_activity_at__lt=threshold).update_row(
        sandbox.pk, last_activity_at=now
    )
    sandbox.last_activity_at = now


def sandbox_touch_id(sandbox_id: str) -> None:
    """sandbox_touch by id, for callers holding no row (terminals, streamed runs)."""
    now = timezone.now()
    Sandbox.objects.filter(
        last_activity_at__lt=now - timedelta(seconds=ACTIVITY_WRITE_INTERVAL_S)
    ).update_row(sandbox_id, last_activity_at=now)
