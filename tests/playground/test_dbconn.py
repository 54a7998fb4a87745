"""A request gives its pooled database connection back while it waits on a sandbox
(common/dbconn.py), and never inside a transaction."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from accounts.models import Organization
from common.dbconn import release_idle_connection
from sandboxes.models import Sandbox
from sandboxes.provider_access import provider_call
from tests.requirements import missing_part

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def pooled() -> None:
    if connection.vendor != "postgresql" or not connection.settings_dict["OPTIONS"].get("pool"):
        missing_part("the pooled-connection tests need PostgreSQL with DJANGO_DB_POOL on")


def test_released_to_the_pool_and_taken_again(pooled: None) -> None:
    Organization.objects.count()
    assert connection.connection is not None
    assert release_idle_connection() is True
    assert connection.connection is None
    assert Organization.objects.count() >= 0  # the next query takes one again
    assert connection.connection is not None


def test_kept_inside_a_transaction(pooled: None) -> None:
    with transaction.atomic():
        Organization.objects.create(name="Kept", slug="kept")
        assert release_idle_connection() is False
        assert connection.connection is not None
    assert Organization.objects.filter(slug="kept").exists()  # committed, not rolled back


def test_nothing_to_release_without_a_connection(pooled: None) -> None:
    connection.close()
    assert release_idle_connection() is False


def test_provider_calls_run_without_a_connection_held(pooled: None) -> None:
    """provider_access.provider_call is the door to every provider operation: while the provider works
    (a command can run for minutes) the request holds no connection."""
    organization = Organization.objects.create(name="Door", slug="door")
    sandbox = Sandbox(organization=organization, provider="local")
    Organization.objects.count()
    held_during_call = provider_call(sandbox, lambda: connection.connection is not None)
    assert held_during_call is False
