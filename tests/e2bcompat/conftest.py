"""The real e2b SDK against a live Sandpit (tests/realtime's daphne), configured only by
E2B's environment variables."""

from __future__ import annotations

import os
from collections import Counter

import pytest

from tests.realtime.conftest import (  # noqa: F401 - fixtures
    SERVER_INSTALLATION,
    daphne_server,
    django_db_modify_db_settings,
    rt_api_a,
    server,
)

E2B_DOMAIN = "e2b.sandpit.test"
# Read by the daphne fixture when it starts the server (settings.SANDPIT_E2B_DOMAIN there).
os.environ.setdefault("SANDPIT_E2B_DOMAIN", E2B_DOMAIN)


@pytest.fixture
def e2b_env(server, key_a, monkeypatch):  # type: ignore[no-untyped-def]  # noqa: F811
    """What a user sets: the API and sandbox URLs on Sandpit, and a Sandpit API key."""
    monkeypatch.setenv("E2B_API_URL", f"{server.http}/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", f"{server.http}/e2b")
    monkeypatch.setenv("E2B_API_KEY", key_a)
    monkeypatch.delenv("E2B_DOMAIN", raising=False)
    monkeypatch.delenv("E2B_DEBUG", raising=False)
    return server


def usage(organization) -> Counter[str]:  # type: ignore[no-untyped-def]
    """Executions counted for the organization so far, by operation."""
    from django.test import override_settings

    from billing.models import UsageEvent
    from billing.services import usage_flush

    # The server meters under its own installation's keys (tests/realtime/conftest.py).
    with override_settings(SANDPIT_INSTALLATION=SERVER_INSTALLATION):
        usage_flush()
    return Counter(
        UsageEvent.objects.filter(organization=organization).values_list("operation", flat=True)
    )
