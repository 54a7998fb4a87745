"""Billing fixtures: Redis keys isolated per test, a free organization, both metering modes."""

from __future__ import annotations

import uuid

import pytest
import redis
from django.conf import settings as django_settings

from accounts.models import Membership, Organization, Role
from accounts.services import api_key_create
from billing import metering
from tests.requirements import missing_part


@pytest.fixture(autouse=True)
def _isolated_billing_keys(settings):  # type: ignore[no-untyped-def]
    """A fresh installation name per test: its Redis stream, counters and dedupe keys are
    its own, and are deleted afterwards (other keys in the shared Redis are left alone)."""
    settings.SANDPIT_INSTALLATION = f"test-{uuid.uuid4().hex[:12]}"
    settings.SANDPIT_FREE_MONTHLY_EXECUTIONS = 1000
    prefix = metering.key_prefix()
    yield prefix
    if django_settings.REDIS_URL:
        client = redis.Redis.from_url(django_settings.REDIS_URL)
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()


@pytest.fixture(params=["redis", "database"])
def meter_mode(request, settings):  # type: ignore[no-untyped-def]
    """Run a test with Redis metering and with embedded (database) metering."""
    if request.param == "redis":
        if not settings.REDIS_URL:
            missing_part("REDIS_URL is not set")
    else:
        settings.REDIS_URL = ""
    return request.param


@pytest.fixture
def free_org(charlie) -> Organization:  # type: ignore[no-untyped-def]
    org = Organization.objects.create(name="Free Org", slug="free-org", plan="free")
    Membership.objects.get_or_create(user=charlie, organization=org, defaults={"role": Role.OWNER})
    return org


@pytest.fixture
def free_key(free_org, charlie) -> str:  # type: ignore[no-untyped-def]
    return api_key_create(organization=free_org, name="free key", created_by=charlie).secret
