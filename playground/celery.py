"""The Celery app and its beat schedule, in code."""

from __future__ import annotations

import os

from celery import Celery
from django.conf import settings

from common.logging import install_routine_task_filter

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "playground.settings")

app = Celery("sandpit")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
install_routine_task_filter()


def _interval(name: str, default: float) -> float:
    return float(getattr(settings, name, default))


app.conf.beat_schedule = {
    "reap-sandboxes": {
        "task": "sandboxes.tasks.reap_sandboxes",
        "schedule": _interval("SANDPIT_REAP_INTERVAL_S", 60),
    },
    "reconcile-sandboxes": {
        "task": "sandboxes.tasks.reconcile_sandboxes",
        "schedule": _interval("SANDPIT_RECONCILE_INTERVAL_S", 300),
    },
    "check-docker-engines": {
        "task": "sandboxes.tasks.check_docker_engines",
        "schedule": _interval("SANDPIT_DOCKER_ENGINE_CHECK_INTERVAL_S", 30),
    },
    "flush-usage": {"task": "billing.tasks.flush_usage", "schedule": 10.0},
    "close-billing-periods": {"task": "billing.tasks.close_billing_periods", "schedule": 3600.0},
}
