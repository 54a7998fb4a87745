"""A principal's organization is served from the row this process read before while Redis
confirms no organization changed (accounts/orgcache.py), and every kind of change is seen by
the very next read: in this process, in another, and while the change's transaction is open.
Real PostgreSQL and Redis."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from accounts import orgcache
from accounts.models import Organization
from accounts.principal import Principal
from common import redis_scripts
from sandboxes import row_cache
from tests.caches import own_cache_prefix, row_reads, until_no_row_is_read
from tests.conftest import assert_error
from tests.organization_writes import WRITES, cap_set, values
from tests.other_process import run_in_another_process


@pytest.fixture(autouse=True)
def _own_epoch(settings: Any) -> Iterator[None]:
    """The epoch under a prefix of this test's own (Redis outlives tests)."""
    with own_cache_prefix(settings, "orgs"):
        yield


def _read(organization_id: int) -> tuple[Organization, int]:
    """The organization as a request authenticated through Redis gets it, and how many
    statements read the organization table for it."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    key = orgcache.epoch_key()
    principal = Principal(
        organization_id=organization_id, read={key: redis_scripts.command(client, "GET", key)}
    )
    with CaptureQueriesContext(connections["default"]) as queries:
        organization = principal.organization
    return organization, sum(
        '"accounts_organization"' in q["sql"] for q in queries.captured_queries
    )


def _cached(organization_id: int) -> Organization:
    """Read until served without the database (the first read writes an epoch)."""
    for _ in range(3):
        organization, reads = _read(organization_id)
        if reads == 0:
            return organization
    raise AssertionError("never served from the cache")


@pytest.mark.django_db
def test_a_repeated_read_is_served_without_the_database_and_is_the_callers_own(
    org_a: Organization,
) -> None:
    first = _cached(org_a.pk)
    assert values(first) == values(Organization.objects.get(pk=org_a.pk))
    first.plan = "free"
    second, reads = _read(org_a.pk)
    assert reads == 0
    assert second is not first and second.plan == "premium"


@pytest.mark.django_db
@pytest.mark.parametrize("write", WRITES.values(), ids=WRITES.keys())
def test_every_kind_of_write_is_seen_by_the_next_read(
    org_a: Organization, write: Callable[[Organization], None]
) -> None:
    before = _cached(org_a.pk)
    write(Organization.objects.get(pk=org_a.pk))
    after, reads = _read(org_a.pk)
    assert reads == 1
    expected = Organization.objects.get(pk=org_a.pk)
    assert values(before) != values(expected)
    assert values(after) == values(expected)
    assert values(_cached(org_a.pk)) == values(expected)


@pytest.mark.django_db
def test_a_new_organization_makes_no_process_read_the_others_again(org_a: Organization) -> None:
    """A sign-up changes no row any process holds: the epoch (and the sandboxes' one) stay."""
    _cached(org_a.pk)
    client = redis.Redis.from_url(settings.REDIS_URL)
    keys = [orgcache.epoch_key(), row_cache.generation_keys("")[1]]
    row_cache.rows_changed(None)
    before = client.mget(keys)
    Organization.objects.create(name="New", slug="new-org")
    assert client.mget(keys) == before
    assert _read(org_a.pk)[1] == 0


@pytest.mark.django_db
@pytest.mark.parametrize("how", ["model", "queryset"])
def test_a_deleted_organization_is_not_found_by_the_next_read(
    org_a: Organization, how: str
) -> None:
    _cached(org_a.pk)
    if how == "model":
        Organization.objects.get(pk=org_a.pk).delete()
    else:
        Organization.objects.filter(pk=org_a.pk).delete()
    with pytest.raises(Organization.DoesNotExist):
        _read(org_a.pk)


@pytest.mark.django_db(transaction=True)
def test_a_change_made_in_another_process_is_seen_at_once(org_a: Organization) -> None:
    _cached(org_a.pk)
    run_in_another_process(
        "from billing.services import organization_spending_cap_set; "
        "from accounts.models import Organization; "
        f"organization_spending_cap_set(organization=Organization.objects.get(pk={org_a.pk}), "
        "cap_cents=123)"
    )
    after, reads = _read(org_a.pk)
    assert (after.spending_cap_cents, reads) == (123, 1)


@pytest.mark.django_db(transaction=True)
def test_a_row_read_while_a_transaction_changes_it_is_read_again_after_its_commit(
    org_a: Organization,
) -> None:
    """The epoch written at once inside the transaction lets another connection cache the
    committed (old) row under it; the epoch written again at commit makes the next read see
    the change."""
    _cached(org_a.pk)
    seen: dict[str, Any] = {}

    def read_on_another_connection() -> None:
        try:
            seen["during"] = _read(org_a.pk)
        finally:
            connection.close()

    with transaction.atomic():
        Organization.objects.filter(pk=org_a.pk).update(name="During")
        reader = threading.Thread(target=read_on_another_connection)
        reader.start()
        reader.join()
    assert (seen["during"][0].name, seen["during"][1]) == ("Org A", 1)
    after, reads = _read(org_a.pk)
    assert (after.name, reads) == ("During", 1)


@pytest.mark.django_db
def test_redis_losing_the_epoch_makes_the_next_read_go_to_the_database(
    org_a: Organization,
) -> None:
    _cached(org_a.pk)
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(orgcache.epoch_key())  # a Redis restarted empty
    # A change Redis never heard of: written behind the signals' back.
    from django.db.models import QuerySet

    QuerySet.update(Organization.objects.filter(pk=org_a.pk), name="Behind")
    after, reads = _read(org_a.pk)
    assert (after.name, reads) == ("Behind", 1)
    assert client.get(orgcache.epoch_key()) is not None  # written again for the next one


@pytest.mark.django_db
def test_an_epoch_that_cannot_be_written_makes_this_process_forget_its_rows(
    org_a: Organization, monkeypatch: pytest.MonkeyPatch
) -> None:
    _cached(org_a.pk)

    def unreachable(*args: object) -> object:
        raise redis.ConnectionError("Redis is down")

    monkeypatch.setattr(redis_scripts, "command", unreachable)
    WRITES["save"](Organization.objects.get(pk=org_a.pk))
    monkeypatch.undo()
    after, reads = _read(org_a.pk)
    assert (after.name, reads) == ("Renamed", 1)


@pytest.mark.django_db
def test_an_entry_is_trusted_only_for_its_maximum_age(
    org_a: Organization, monkeypatch: pytest.MonkeyPatch
) -> None:
    _cached(org_a.pk)
    monkeypatch.setattr(orgcache, "MAX_AGE_S", -1.0)
    assert _read(org_a.pk)[1] == 1
    assert _read(org_a.pk)[1] == 1


@pytest.mark.django_db
def test_without_redis_every_read_goes_to_the_database(org_a: Organization, settings: Any) -> None:
    settings.REDIS_URL = ""
    principal = Principal(organization_id=org_a.pk)
    for _ in range(3):
        with CaptureQueriesContext(connections["default"]) as queries:
            assert Principal(organization_id=org_a.pk).organization.pk == org_a.pk
        assert len(queries.captured_queries) == 1
    assert principal.organization.name == "Org A"


@pytest.mark.django_db
def test_another_organizations_row_is_never_served(
    org_a: Organization, org_b: Organization
) -> None:
    assert _cached(org_a.pk).pk == org_a.pk
    assert _cached(org_b.pk).pk == org_b.pk
    assert _read(org_a.pk)[0].name == "Org A" and _read(org_b.pk)[0].name == "Org B"


@pytest.mark.django_db
def test_the_rows_held_stay_within_their_bound(
    org_a: Organization, org_b: Organization, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(orgcache, "MAX_ENTRIES", 1)
    _cached(org_a.pk)
    assert orgcache.held() == 1
    _read(org_b.pk)
    assert orgcache.held() == 1
    assert _read(org_a.pk)[1] == 1  # forgotten to make room


@pytest.mark.django_db
def test_a_create_reads_no_organization_row_once_known_and_a_cap_stops_the_next_one(
    api_a: APIClient, org_a: Organization, local_sandboxes: Any
) -> None:
    """Through the API: billing's read of the organization for a create comes from the
    cache, and a spending cap set meanwhile refuses the very next create."""

    def create() -> Any:
        return api_a.post("/api/v1/sandboxes", {}, format="json")

    # The key's own cache confirms it within four requests; the first of those to read the
    # organizations' epoch finds none and writes it; the next stores the row.
    until_no_row_is_read(create, ('"accounts_organization"',), status=201, attempts=8)
    cap_set(Organization.objects.get(pk=org_a.pk))
    response, reads = row_reads(create, ('"accounts_organization"',))
    assert_error(response, 402, "spending_cap_reached")
    assert reads == 1
