"""The Celery app and its beat schedule, in code."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "playground.settings")

app = Celery("sandpit")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

app.conf.beat_schedule = {
    "reap-sandboxes": {"task": "sandboxes.tasks.reap_sandboxes", "schedule": 60.0},
    "reconcile-sandboxes": {"task": "sandboxes.tasks.reconcile_sandboxes", "schedule": 300.0},
    "flush-usage": {"task": "billing.tasks.flush_usage", "schedule": 10.0},
    "close-billing-periods": {"task": "billing.tasks.close_billing_periods", "schedule": 3600.0},
}
