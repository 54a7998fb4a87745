"""`manage.py ensure_demo`, which `make run` calls: the first run shows the whole product."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from accounts.models import Organization
from billing.services import organization_plan_change

pytestmark = pytest.mark.django_db


def _ensure_demo() -> str:
    out = StringIO()
    call_command("ensure_demo", stdout=out)
    return out.getvalue()


def test_demo_message_names_the_configured_port(settings) -> None:
    settings.SANDPIT_PORT = 8123
    assert "at http://127.0.0.1:8123/" in _ensure_demo()


def test_demo_message_on_a_wildcard_bind_names_a_reachable_address(settings) -> None:
    settings.SANDPIT_BIND = "0.0.0.0"  # noqa: S104
    assert "at http://127.0.0.1:8000/" in _ensure_demo()


def test_fresh_demo_organization_is_premium() -> None:
    _ensure_demo()
    assert Organization.objects.get(slug="demo").plan == "premium"


def test_a_chosen_plan_is_left_alone_on_the_next_run() -> None:
    _ensure_demo()
    demo = Organization.objects.get(slug="demo")
    organization_plan_change(organization=demo, plan="free", requested_by=None)
    # A downgrade takes effect next month; apply it now as the month's end would.
    Organization.objects.filter(pk=demo.pk).update(plan="free")
    _ensure_demo()
    assert Organization.objects.get(slug="demo").plan == "free"
