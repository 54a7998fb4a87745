"""A request on a sandbox is answered from the row this process read before (a GET's, or an
operation's with its organization's), once Redis confirms that nothing changed it
(sandboxes/row_cache.py), and every kind of write, to the sandbox or to its organization, is
seen by the very next read: in this process, in another, and while the write's transaction
is open."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import Organization
from accounts.principal import Principal
from common import redis_scripts
from common.errors import NotFound
from sandboxes import row_cache
from sandboxes.activity import sandbox_touch, sandbox_touch_id
from sandboxes.models import Sandbox, SandboxState
from sandboxes.provider_access import sandbox_started, sandbox_transition
from sandboxes.providers import get_provider, reset_providers
from sandboxes.providers.base import ProviderUnavailable
from sandboxes.providers.local import LocalProvider, jail_cgroups
from sandboxes.providers.local.pool import PREFIX as WARM_PREFIX
from sandboxes.providers.local.provider import LocalWarmReservation
from sandboxes.selectors import (
    SANDBOX_BY_ID_AND_ORGANIZATION,
    SANDBOX_WITH_ORGANIZATION,
    sandbox_get_for_principal,
)
from tests import organization_writes
from tests.caches import own_cache_prefix, row_reads, until_no_row_is_read
from tests.conftest import assert_error
from tests.other_process import run_in_another_process
from tests.requirements import jail_root


@pytest.fixture(autouse=True)
def _own_generations(settings: Any) -> Iterator[None]:
    """Generations and epochs under a prefix of this test's own (Redis outlives tests)."""
    with own_cache_prefix(settings, "rows"):
        yield


def _row(organization: Organization, **fields: Any) -> Sandbox:
    now = timezone.now()
    values: dict[str, Any] = {
        "organization": organization,
        "provider": "local",
        "state": SandboxState.RUNNING,
        "timeout_s": 300,
        "started_at": now,
        "last_activity_at": now - timedelta(minutes=5),
        "expires_at": now + timedelta(hours=1),
        "metadata": {"v": 1},
    }
    return Sandbox.objects.create(**(values | fields))


def _get(client: APIClient, sandbox_id: str) -> tuple[Any, int]:
    """(the response, how many statements read the sandbox table) of one GET."""
    with CaptureQueriesContext(connections["default"]) as queries:
        response = client.get(f"/api/v1/sandboxes/{sandbox_id}")
    return response, sum(
        q["sql"].startswith("SELECT") and '"sandboxes_sandbox"' in q["sql"]
        for q in queries.captured_queries
    )


def _cached(client: APIClient, sandbox_id: str) -> dict[str, Any]:
    """Read until served without the database (the key's own cache warms within four
    requests, the epoch is written by the first), then once more from the cache."""
    for _ in range(6):
        response, reads = _get(client, sandbox_id)
        assert response.status_code == 200, response.content
        if reads == 0:
            break
    response, reads = _get(client, sandbox_id)
    assert (response.status_code, reads) == (200, 0), response.content
    body: dict[str, Any] = response.json()
    return body


@pytest.fixture
def cached_row(api_a: APIClient, org_a: Organization) -> Sandbox:
    """A sandbox's row of organization A, read by A's key until served from the cache."""
    sandbox = _row(org_a)
    _cached(api_a, sandbox.id)
    return sandbox


def _fresh(client: APIClient, sandbox_id: str) -> dict[str, Any]:
    """A GET that must read the database (something changed), and what it answered."""
    response, reads = _get(client, sandbox_id)
    assert (response.status_code, reads) == (200, 1), response.content
    body: dict[str, Any] = response.json()
    return body


@pytest.mark.django_db
def test_a_repeated_read_is_served_without_the_database_and_equals_a_fresh_one(
    api_a: APIClient, org_a: Organization
) -> None:
    sandbox = _row(org_a)
    cached = _cached(api_a, sandbox.id)
    row_cache.forget_all()
    assert _fresh(api_a, sandbox.id) == cached
    assert cached["metadata"] == {"v": 1} and cached["state"] == "running"


def _save(sandbox: Sandbox) -> None:
    sandbox.metadata = {"v": 2}
    sandbox.save()


def _queryset_update(sandbox: Sandbox) -> None:
    Sandbox.objects.filter(organization_id=sandbox.organization_id).update(metadata={"v": 2})


def _bulk_update(sandbox: Sandbox) -> None:
    sandbox.metadata = {"v": 2}
    Sandbox.objects.bulk_update([sandbox], ["metadata"])


def _update_row(sandbox: Sandbox) -> None:
    Sandbox.objects.filter(state=SandboxState.RUNNING).update_row(sandbox.id, metadata={"v": 2})


def _transition_statement(sandbox: Sandbox) -> None:
    assert sandbox_transition(sandbox, SandboxState.PAUSED, paused_at=timezone.now())


def _transition_orm(sandbox: Sandbox) -> None:
    assert sandbox_transition(
        sandbox, SandboxState.PAUSED, where={"provider": "local"}, paused_at=timezone.now()
    )


def _touch(sandbox: Sandbox) -> None:
    sandbox_touch(Sandbox.objects.get(pk=sandbox.pk))


def _touch_id(sandbox: Sandbox) -> None:
    sandbox_touch_id(sandbox.id)


WRITES: dict[str, Callable[[Sandbox], None]] = {
    "save": _save,
    "queryset-update": _queryset_update,
    "bulk-update": _bulk_update,
    "update-row": _update_row,
    "transition-statement": _transition_statement,
    "transition-orm": _transition_orm,
    "activity": _touch,
    "activity-by-id": _touch_id,
}


@pytest.mark.django_db
@pytest.mark.parametrize("write", WRITES.values(), ids=WRITES.keys())
def test_every_kind_of_write_is_seen_by_the_next_read(
    api_a: APIClient, org_a: Organization, write: Callable[[Sandbox], None]
) -> None:
    sandbox = _row(org_a)
    before = _cached(api_a, sandbox.id)
    write(sandbox)
    after = _fresh(api_a, sandbox.id)
    changed = {name for name in before if before[name] != after[name]}
    assert changed, (before, after)
    expected = Sandbox.objects.get(pk=sandbox.pk)
    assert after["metadata"] == expected.metadata and after["state"] == expected.state
    assert _cached(api_a, sandbox.id) == after


@pytest.mark.django_db
@pytest.mark.parametrize("how", ["model", "queryset"])
def test_a_deleted_row_is_not_found_by_the_next_read(
    api_a: APIClient, cached_row: Sandbox, how: str
) -> None:
    sandbox = cached_row
    if how == "model":
        sandbox.delete()
    else:
        Sandbox.objects.filter(pk=sandbox.pk).delete()
    assert_error(api_a.get(f"/api/v1/sandboxes/{sandbox.id}"), 404, "sandbox_not_found")


@pytest.mark.django_db
def test_another_organization_never_gets_a_cached_row(
    api_a: APIClient, api_b: APIClient, cached_row: Sandbox
) -> None:
    sandbox = cached_row
    for _ in range(5):  # org B's key warm in its own cache too
        assert_error(api_b.get(f"/api/v1/sandboxes/{sandbox.id}"), 404, "sandbox_not_found")
        assert_error(api_b.get(f"/api/v1/sandboxes/{sandbox.id}/stats"), 404)


@pytest.mark.django_db
def test_a_change_landing_right_after_the_database_read_is_not_hidden(
    api_a: APIClient, cached_row: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The entry keeps the generation read with the authentication, before the database
    read: a change (and its new generation) that lands after the read makes the next request
    read again, though the entry holds the old row."""
    from sandboxes.selectors import SANDBOX_BY_ID_AND_ORGANIZATION as lookup

    sandbox = cached_row
    sandbox_touch_id(sandbox.id)  # the entry is stale; the next read re-reads
    read_row = lookup.row

    def read_then_changed(*params: str | int, using: str = "default") -> Any:
        row = read_row(*params, using=using)
        Sandbox.objects.update_row(sandbox.id, metadata={"v": 3})
        return row

    monkeypatch.setattr(lookup, "row", read_then_changed)
    assert _fresh(api_a, sandbox.id)["metadata"] == {"v": 1}  # read before the change
    monkeypatch.setattr(lookup, "row", read_row)
    assert _fresh(api_a, sandbox.id)["metadata"] == {"v": 3}


@pytest.mark.django_db(transaction=True)
def test_a_row_read_while_a_transaction_changes_it_is_read_again_after_its_commit(
    api_a: APIClient, cached_row: Sandbox
) -> None:
    """Inside the transaction the change's generation is written at once; a request on
    another connection then reads the committed (old) row under that new generation. The
    generation written again at commit is what makes the next read see the change."""
    sandbox = cached_row
    seen: dict[str, Any] = {}

    def read_on_another_connection() -> None:
        try:
            seen["during"] = _get(api_a, sandbox.id)[0].json()
        finally:
            connection.close()

    with transaction.atomic():
        Sandbox.objects.update_row(sandbox.id, metadata={"v": 4})
        reader = threading.Thread(target=read_on_another_connection)
        reader.start()
        reader.join()
    assert seen["during"]["metadata"] == {"v": 1}  # the committed row, then
    assert _fresh(api_a, sandbox.id)["metadata"] == {"v": 4}


@pytest.mark.django_db(transaction=True)
def test_a_change_made_in_another_process_is_seen_at_once(
    api_a: APIClient, cached_row: Sandbox
) -> None:
    sandbox = cached_row
    run_in_another_process(
        "from sandboxes.provider_access import sandbox_transition; "
        "from sandboxes.models import Sandbox; "
        f"assert sandbox_transition(Sandbox.objects.get(pk='{sandbox.id}'), 'stopped')"
    )
    assert _fresh(api_a, sandbox.id)["state"] == "stopped"


@pytest.mark.django_db
def test_redis_losing_its_data_makes_every_read_go_to_the_database(
    api_a: APIClient, cached_row: Sandbox
) -> None:
    sandbox = cached_row
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(*row_cache.generation_keys(sandbox.id))  # a Redis restarted empty
    # A change Redis never heard of: written behind every generation's back.
    from django.db.models import QuerySet

    QuerySet.update(Sandbox.objects.filter(pk=sandbox.pk), metadata={"v": 5})
    assert _fresh(api_a, sandbox.id)["metadata"] == {"v": 5}


@pytest.mark.django_db
def test_a_generation_that_cannot_be_written_makes_this_process_forget_its_rows(
    api_a: APIClient, cached_row: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox = cached_row

    def unreachable(*args: object) -> object:
        raise redis.ConnectionError("Redis is down")

    monkeypatch.setattr(redis_scripts, "command", unreachable)
    Sandbox.objects.update_row(sandbox.id, metadata={"v": 6})
    monkeypatch.undo()
    assert _fresh(api_a, sandbox.id)["metadata"] == {"v": 6}


@pytest.mark.django_db
def test_an_entry_is_trusted_only_for_its_maximum_age(
    api_a: APIClient, cached_row: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox = cached_row
    monkeypatch.setattr(row_cache, "MAX_AGE_S", -1.0)
    _fresh(api_a, sandbox.id)
    _fresh(api_a, sandbox.id)


@pytest.mark.django_db
def test_without_redis_every_read_goes_to_the_database(
    api_a: APIClient,
    org_a: Organization,
    settings: Any,
) -> None:
    settings.REDIS_URL = ""
    sandbox = _row(org_a)
    for _ in range(4):
        _fresh(api_a, sandbox.id)
    Sandbox.objects.update_row(sandbox.id, metadata={"v": 7})  # no Redis to tell
    assert _fresh(api_a, sandbox.id)["metadata"] == {"v": 7}


@pytest.mark.django_db
def test_a_served_instance_is_the_callers_own(org_a: Organization) -> None:
    """A view may change the instance it gets (or its metadata's dict): the next request's
    is built afresh from the row."""
    sandbox = _row(org_a)
    client = redis.Redis.from_url(settings.REDIS_URL)
    keys = row_cache.generation_keys(sandbox.id)
    row_cache.rows_changed(None)  # an epoch to trust

    def read() -> Sandbox:
        principal = Principal(
            organization_id=org_a.pk,
            read=dict(zip(keys, redis_scripts.command(client, "MGET", *keys), strict=True)),
        )
        return sandbox_get_for_principal(
            principal=principal, sandbox_id=sandbox.id, with_organization=False
        )

    first = read()
    first.metadata["v"] = 99
    first.state = SandboxState.ERROR
    with CaptureQueriesContext(connections["default"]) as queries:
        second = read()
    assert not queries.captured_queries  # from the entry
    assert second.metadata == {"v": 1} and second.state == SandboxState.RUNNING
    assert second is not first and second.metadata is not first.metadata


def test_a_request_naming_a_sandbox_reads_its_generation_whatever_its_method() -> None:
    for method in ("GET", "POST", "PUT", "DELETE"):
        assert row_cache.keys_for_request(method, {"sandbox_id": "sb_1"}) == (
            row_cache.generation_keys("sb_1")
        )
    assert row_cache.keys_for_request("GET", {"sandbox_id": 7}) == []
    # A POST naming no sandbox may create one: it reads the epoch its create keeps the
    # row under (provider_access.sandbox_started); nothing else does.
    assert row_cache.keys_for_request("POST", {}) == row_cache.generation_keys("")[1:]
    assert (
        row_cache.keys_for_request("POST", {"snapshot_id": "sn_1"})
        == (row_cache.generation_keys("")[1:])
    )
    assert row_cache.keys_for_request("GET", {}) == []


def _operation_read(organization: Organization, sandbox_id: str) -> tuple[Sandbox, int]:
    """An operation's read of a sandbox (with its organization's row, for billing), as a
    request authenticated through Redis makes it; and how many statements it took, giving
    the principal's organization to billing included."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    keys = row_cache.generation_keys(sandbox_id)
    principal = Principal(
        organization_id=organization.pk,
        read=dict(zip(keys, redis_scripts.command(client, "MGET", *keys), strict=True)),
    )
    with CaptureQueriesContext(connections["default"]) as queries:
        sandbox = sandbox_get_for_principal(principal=principal, sandbox_id=sandbox_id)
        assert principal.organization is sandbox.organization
    return sandbox, len(queries.captured_queries)


@pytest.mark.django_db
def test_an_operations_read_with_its_organization_is_served_from_the_cache(
    org_a: Organization,
) -> None:
    sandbox = _row(org_a)
    row_cache.rows_changed(None)  # an epoch to trust
    fresh, reads = _operation_read(org_a, sandbox.id)
    assert reads == 1
    cached, reads = _operation_read(org_a, sandbox.id)
    assert reads == 0
    assert cached is not fresh and cached.organization is not fresh.organization
    for name in ("plan", "spending_cap_cents", "max_concurrent_sandboxes", "allow_network"):
        assert getattr(cached.organization, name) == getattr(org_a, name)
    assert (cached.state, cached.metadata) == (fresh.state, fresh.metadata)


@pytest.mark.django_db
def test_a_reads_plain_row_and_an_operations_joined_row_are_kept_apart(
    api_a: APIClient, cached_row: Sandbox, org_a: Organization
) -> None:
    """A GET's entry holds no organization: an operation reads its own, and each is then
    served from its entry."""
    _, reads = _operation_read(org_a, cached_row.id)
    assert reads == 1
    assert _operation_read(org_a, cached_row.id)[1] == 0
    assert _get(api_a, cached_row.id)[1] == 0


@pytest.mark.django_db
@pytest.mark.parametrize(
    "write", organization_writes.WRITES.values(), ids=organization_writes.WRITES.keys()
)
def test_every_kind_of_write_to_the_organization_is_seen_by_the_next_operation(
    org_a: Organization, write: Callable[[Organization], None]
) -> None:
    sandbox = _row(org_a)
    row_cache.rows_changed(None)
    _operation_read(org_a, sandbox.id)
    before, reads = _operation_read(org_a, sandbox.id)
    assert reads == 0
    write(Organization.objects.get(pk=org_a.pk))
    after, reads = _operation_read(org_a, sandbox.id)
    assert reads == 1
    expected = Organization.objects.get(pk=org_a.pk)
    assert organization_writes.values(before.organization) != organization_writes.values(expected)
    assert organization_writes.values(after.organization) == organization_writes.values(expected)


@pytest.mark.django_db
@pytest.mark.parametrize("how", ["model", "queryset"])
def test_a_deleted_organizations_sandbox_is_not_found_by_the_next_operation(
    org_a: Organization, how: str
) -> None:
    sandbox = _row(org_a)
    row_cache.rows_changed(None)
    _operation_read(org_a, sandbox.id)
    assert _operation_read(org_a, sandbox.id)[1] == 0
    if how == "model":
        Organization.objects.get(pk=org_a.pk).delete()
    else:
        Organization.objects.filter(pk=org_a.pk).delete()
    with pytest.raises(NotFound):
        _operation_read(org_a, sandbox.id)


@pytest.mark.django_db
def test_commands_read_no_row_once_cached_and_a_spending_cap_stops_the_next_one(
    api_a: APIClient, sandbox_a: dict[str, Any], org_a: Organization
) -> None:
    """Through the API on a real sandbox: a command after the first reads neither the
    sandbox's row nor its organization's, and billing still sees a cap set meanwhile at
    once (the cap's save writes a new epoch)."""
    sandbox_id = sandbox_a["id"]
    url = f"/api/v1/sandboxes/{sandbox_id}/commands"

    def command() -> Any:
        return api_a.post(url, {"command": "echo", "args": ["hi"]}, format="json")

    tables = ('"sandboxes_sandbox"', '"accounts_organization"')
    response = until_no_row_is_read(command, tables)
    assert response.json()["stdout"] == "hi\n"
    organization_writes.cap_set(Organization.objects.get(pk=org_a.pk))
    response, reads = row_reads(command, tables)
    assert_error(response, 402, "spending_cap_reached")
    assert reads >= 1


@pytest.mark.django_db
def test_a_row_still_being_created_is_never_kept_and_its_move_to_running_is_seen(
    api_a: APIClient, org_a: Organization
) -> None:
    """The create's move out of CREATING writes no generation (no process may hold the row
    it changes): a process that read the row while it was created reads it again."""
    assert row_cache.NEVER_KEPT_STATE == SandboxState.CREATING
    sandbox = _row(org_a, state=SandboxState.CREATING, started_at=None)
    for _ in range(4):
        assert _fresh(api_a, sandbox.id)["state"] == "creating"
    assert row_cache.held() == (0, 0)
    assert sandbox_transition(
        sandbox, SandboxState.RUNNING, from_state=SandboxState.CREATING, provider_id="p-1"
    )
    client = redis.Redis.from_url(settings.REDIS_URL)
    assert client.get(row_cache.generation_keys(sandbox.id)[0]) is None  # none written
    assert _fresh(api_a, sandbox.id)["state"] == "running"
    assert _cached(api_a, sandbox.id)["state"] == "running"
    # Only from CREATING: from any other state it changes nothing.
    assert not sandbox_transition(
        sandbox, SandboxState.RUNNING, from_state=SandboxState.CREATING, provider_id="p-2"
    )


@pytest.mark.django_db
def test_a_create_through_the_api_writes_no_generation_and_reads_running(
    api_a: APIClient, local_sandboxes: Any
) -> None:
    response = api_a.post("/api/v1/sandboxes", {}, format="json")
    assert response.status_code == 201, response.content
    sandbox_id = response.json()["id"]
    client = redis.Redis.from_url(settings.REDIS_URL)
    assert client.get(row_cache.generation_keys(sandbox_id)[0]) is None
    assert _cached(api_a, sandbox_id)["state"] == "running"
    destroyed = api_a.delete(f"/api/v1/sandboxes/{sandbox_id}")
    assert destroyed.status_code == 200, destroyed.content
    assert _fresh(api_a, sandbox_id)["state"] == "destroyed"


@pytest.mark.django_db
def test_a_timeout_set_through_the_api_is_seen_by_the_next_read(
    api_a: APIClient, sandbox_a: dict[str, Any]
) -> None:
    sandbox_id = sandbox_a["id"]
    before = _cached(api_a, sandbox_id)
    response = api_a.post(
        f"/api/v1/sandboxes/{sandbox_id}/timeout", {"timeout_s": 4321}, format="json"
    )
    assert response.status_code == 200, response.content
    after = _fresh(api_a, sandbox_id)
    assert (before["timeout_s"], after["timeout_s"]) != (4321, 4321)
    assert after["timeout_s"] == 4321
    destroyed = api_a.delete(f"/api/v1/sandboxes/{sandbox_id}")
    assert destroyed.status_code == 200, destroyed.content
    assert _fresh(api_a, sandbox_id)["state"] == "destroyed"


@pytest.mark.django_db
def test_the_rows_held_stay_within_their_bounds_whatever_clients_store(
    org_a: Organization, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Metadata of up to 16 KB per sandbox, many sandboxes: the entries and the text they
    hold stay under their limits (the process forgets them all and reads again), and every
    read still answers the row as stored."""
    monkeypatch.setattr(row_cache, "MAX_TEXT_CHARS", 40_000)
    monkeypatch.setattr(row_cache, "MAX_ENTRIES", 5)
    client = redis.Redis.from_url(settings.REDIS_URL)
    row_cache.rows_changed(None)  # an epoch to trust
    rows = [_row(org_a, metadata={"blob": f"{n}" * 15_000}) for n in range(12)]
    most = (0, 0)
    for _ in range(2):
        for sandbox in rows:
            keys = row_cache.generation_keys(sandbox.id)
            principal = Principal(
                organization_id=org_a.pk,
                read=dict(zip(keys, redis_scripts.command(client, "MGET", *keys), strict=True)),
            )
            read = sandbox_get_for_principal(
                principal=principal, sandbox_id=sandbox.id, with_organization=False
            )
            assert read.metadata == sandbox.metadata
            entries, chars = row_cache.held()
            most = (max(most[0], entries), max(most[1], chars))
    assert 0 < most[0] <= 5 and 30_000 < most[1] <= 40_000, most


def _epoch() -> Any:
    """The epoch in Redis now (one written if there is none)."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    key = row_cache.generation_keys("")[1]
    client.set(key, "first-epoch", nx=True)
    return client.get(key)


def _known_key(client: APIClient) -> None:
    """Until the client's key is known to this process (confirmed in Redis, with the
    request's keys read in that round trip)."""
    until_no_row_is_read(lambda: client.get("/api/v1/organization"), ('"accounts_organization"',))


def _creating(organization: Organization) -> Sandbox:
    return _row(organization, state=SandboxState.CREATING, started_at=None)


def _started(sandbox: Sandbox, epoch: Any) -> bool:
    """The create's move to running, by a request whose authentication read `epoch`."""
    key = row_cache.generation_keys("")[1]
    principal = Principal(organization_id=sandbox.organization_id, read={key: epoch})
    return sandbox_started(sandbox, principal, provider_id="p-1", started_at=timezone.now())


@pytest.mark.django_db
def test_a_creates_move_to_running_keeps_the_rows_the_database_would_give(
    api_a: APIClient, org_a: Organization
) -> None:
    """What the move keeps is what each lookup reads from the database right after it, to
    the last column, and the next read and operation are served from it."""
    _known_key(api_a)
    sandbox = _creating(org_a)
    assert _started(sandbox, _epoch())
    assert sandbox.state == SandboxState.RUNNING and row_cache.held()[0] == 2
    for lookup, join in (
        (SANDBOX_WITH_ORGANIZATION, "organization"),
        (SANDBOX_BY_ID_AND_ORGANIZATION, ""),
    ):
        kept = row_cache._rows[(join, sandbox.id)]
        assert kept.row == lookup.row(sandbox.id, org_a.pk)
        assert kept.generation == (None, _epoch())
    body, reads = _get(api_a, sandbox.id)
    assert (body.status_code, reads) == (200, 0), body.content
    row_cache.forget_all()
    assert _fresh(api_a, sandbox.id) == body.json()
    assert body.json()["state"] == "running"
    assert Sandbox.objects.get(pk=sandbox.pk).provider_id == "p-1"


@pytest.mark.django_db
def test_a_kept_row_is_not_served_after_the_epoch_changed_before_or_after_the_move(
    api_a: APIClient, org_a: Organization
) -> None:
    _known_key(api_a)
    before = _epoch()
    row_cache.rows_changed(None)  # between the create's authentication and its move
    sandbox = _creating(org_a)
    assert _started(sandbox, before)
    assert _fresh(api_a, sandbox.id)["state"] == "running"
    other = _creating(org_a)
    assert _started(other, _epoch())
    row_cache.rows_changed(None)  # after it
    assert _fresh(api_a, other.id)["state"] == "running"


@pytest.mark.django_db
@pytest.mark.parametrize("write", WRITES.values(), ids=WRITES.keys())
def test_every_kind_of_write_after_a_creates_move_is_seen_by_the_next_read(
    api_a: APIClient, org_a: Organization, write: Callable[[Sandbox], None]
) -> None:
    _known_key(api_a)
    sandbox = _creating(org_a)
    assert _started(sandbox, _epoch())
    before, reads = _get(api_a, sandbox.id)
    assert (before.status_code, reads) == (200, 0), before.content
    write(sandbox)
    after = _fresh(api_a, sandbox.id)
    changed = {name for name in after if before.json()[name] != after[name]}
    assert changed, after
    row_cache.forget_all()
    assert _fresh(api_a, sandbox.id) == after


@pytest.mark.django_db
def test_a_lost_move_keeps_nothing_and_a_move_without_the_epoch_keeps_nothing(
    api_a: APIClient, org_a: Organization
) -> None:
    _known_key(api_a)
    destroyed = _creating(org_a)
    assert sandbox_transition(destroyed, SandboxState.DESTROYED)
    assert not _started(destroyed, _epoch())  # destroyed while it was created
    assert row_cache.held() == (0, 0)
    assert _fresh(api_a, destroyed.id)["state"] == "destroyed"
    unread = _creating(org_a)
    principal = Principal(organization_id=org_a.pk, read={})  # the epoch was not read
    assert sandbox_started(unread, principal, provider_id="p-2")
    assert not [key for key in row_cache._rows if key[1] == unread.id]
    assert _fresh(api_a, unread.id)["state"] == "running"


@pytest.mark.django_db
def test_a_sandboxs_first_command_after_its_create_reads_no_row(
    api_a: APIClient, org_a: Organization, local_sandboxes: Any
) -> None:
    """Through the API on a real sandbox: the create keeps what it wrote, so its first
    command reads neither the sandbox's row nor its organization's, and its first read
    no row either; a destroy is seen by the next read at once."""
    _epoch()
    _known_key(api_a)
    response = api_a.post("/api/v1/sandboxes", {}, format="json")
    assert response.status_code == 201, response.content
    sandbox_id = response.json()["id"]
    tables = ('"sandboxes_sandbox"', '"accounts_organization"')
    command, reads = row_reads(
        lambda: api_a.post(
            f"/api/v1/sandboxes/{sandbox_id}/commands", {"command": "echo hi"}, format="json"
        ),
        tables,
    )
    assert command.status_code == 200 and command.json()["stdout"] == "hi\n", command.content
    assert reads == 0
    body, reads = _get(api_a, sandbox_id)
    assert (body.status_code, reads, body.json()["state"]) == (200, 0, "running")
    assert api_a.delete(f"/api/v1/sandboxes/{sandbox_id}").status_code == 200
    assert _fresh(api_a, sandbox_id)["state"] == "destroyed"


@pytest.fixture
def warm_local(settings: Any) -> Iterator[Any]:
    """The real local provider with a pool of two warm jails, full before the test runs."""
    settings.SANDPIT_PROVIDERS = ["local"]
    settings.SANDPIT_DEFAULT_PROVIDER = "local"
    settings.SANDPIT_LOCAL_ROOT = jail_root("warm-api")
    settings.SANDPIT_LOCAL_WARM_POOL = 2
    reset_providers()
    provider = get_provider("local")
    provider.warm_pool_start()
    assert provider._pool.wait_full(30), "the warm pool did not fill"
    yield provider
    for handle in provider.list_sandboxes():
        provider.destroy(handle.provider_id)
    reset_providers()


def _warm_dirs(provider: Any) -> set[str]:
    return {path.name for path in provider.root_dir.glob(f"{WARM_PREFIX}*")}


@pytest.mark.django_db(transaction=True)  # outside a transaction, as a request runs it
def test_a_create_on_a_warm_jail_writes_its_row_once_running_and_keeps_it(
    api_a: APIClient, org_a: Organization, warm_local: Any
) -> None:
    """A warm jail is set aside before the create is admitted, so the row goes in already
    running: one statement writes the sandbox table (no move to running after it), what
    the create keeps is what each lookup then reads, and the first command reads no row."""
    epoch = _epoch()
    _known_key(api_a)
    with CaptureQueriesContext(connections["default"]) as queries:
        response = api_a.post("/api/v1/sandboxes", {}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["state"] == "running"
    sandbox_id = response.json()["id"]
    writes = [
        q["sql"]
        for q in queries.captured_queries
        if '"sandboxes_sandbox"' in q["sql"] and not q["sql"].startswith("SELECT")
    ]
    assert len(writes) == 1 and 'INSERT INTO "sandboxes_sandbox"' in writes[0], writes
    assert 'UPDATE "sandboxes_sandbox"' not in writes[0]
    row = Sandbox.objects.get(pk=sandbox_id)
    assert (row.state, row.provider_id, row.engine) == (SandboxState.RUNNING, sandbox_id, "")
    assert row.started_at is not None and row.last_activity_at == row.started_at
    state = json.loads((warm_local.root_dir / sandbox_id / "state.json").read_text())
    assert all(f"/{WARM_PREFIX}" in path for path in state["cgroups"].values())  # was warm
    for lookup, join in (
        (SANDBOX_WITH_ORGANIZATION, "organization"),
        (SANDBOX_BY_ID_AND_ORGANIZATION, ""),
    ):
        kept = row_cache._rows[(join, sandbox_id)]
        assert kept.row == lookup.row(sandbox_id, org_a.pk)
        assert kept.generation == (None, epoch)
    command, reads = row_reads(
        lambda: api_a.post(
            f"/api/v1/sandboxes/{sandbox_id}/commands", {"command": "echo hi"}, format="json"
        ),
        ('"sandboxes_sandbox"', '"accounts_organization"'),
    )
    assert command.status_code == 200 and command.json()["stdout"] == "hi\n", command.content
    assert reads == 0
    assert api_a.delete(f"/api/v1/sandboxes/{sandbox_id}").status_code == 200
    assert _fresh(api_a, sandbox_id)["state"] == "destroyed"


@pytest.mark.django_db
def test_a_create_refused_at_the_limit_spends_no_warm_jail(
    api_a: APIClient, org_a: Organization, warm_local: Any
) -> None:
    Organization.objects.filter(pk=org_a.pk).update(max_concurrent_sandboxes=1)
    _row(org_a)
    before = _warm_dirs(warm_local)
    for _ in range(3):
        assert_error(
            api_a.post("/api/v1/sandboxes", {}, format="json"), 429, "sandbox_limit_reached"
        )
    assert _warm_dirs(warm_local) == before and len(before) == 2
    assert warm_local._pool.idle_count() == 2
    assert Sandbox.objects.filter(organization=org_a).count() == 1
    assert row_cache.held() == (0, 0)


@pytest.mark.django_db
def test_a_warm_create_that_cannot_start_ends_in_error_and_is_read_so(
    api_a: APIClient, org_a: Organization, warm_local: Any, monkeypatch: Any
) -> None:
    """The row went in running before the jail was adopted; neither the warm jail nor a cold
    start could give the sandbox its limits, so it ends in error, and the row the create
    kept is not served after that."""
    _epoch()
    _known_key(api_a)
    monkeypatch.setattr(jail_cgroups, "cgroups_set_limits", lambda paths, res: False)
    monkeypatch.setattr(
        LocalProvider,
        "_start_cold",
        lambda self, spec, sdir, env: (_ for _ in ()).throw(
            ProviderUnavailable("no cold start in this test")
        ),
    )
    # Not the pool's own resources, which a claim would not write again.
    body = {"resources": {"memory_mb": 256}}
    response = api_a.post("/api/v1/sandboxes", body, format="json")
    assert response.status_code == 503, response.content
    assert response.json()["error"]["message"] == "no cold start in this test"
    (row,) = Sandbox.objects.filter(organization=org_a)
    assert row.state == SandboxState.ERROR and row.error_message == "no cold start in this test"
    assert _fresh(api_a, row.pk)["state"] == "error"


@pytest.mark.django_db(transaction=True)  # outside a transaction, as a request runs it
def test_a_warm_create_destroyed_before_its_jail_is_adopted_leaves_no_jail(
    api_a: APIClient, org_a: Organization, warm_local: Any, monkeypatch: Any
) -> None:
    """The row goes in already running before the warm jail is adopted, so a destroy can
    land in between (here, the tenant's own DELETE at that very moment). The destroy wins:
    the create answers with the sandbox as it now is, and no jail is left running with its
    row destroyed."""
    before = _warm_dirs(warm_local)
    adopt = LocalWarmReservation.adopt

    def destroyed_first(self: LocalWarmReservation) -> Any:
        (row,) = Sandbox.objects.filter(organization=org_a)
        assert row.state == SandboxState.RUNNING
        assert api_a.delete(f"/api/v1/sandboxes/{row.pk}").status_code == 200
        return adopt(self)

    monkeypatch.setattr(LocalWarmReservation, "adopt", destroyed_first)
    response = api_a.post("/api/v1/sandboxes", {}, format="json")
    monkeypatch.undo()
    assert response.status_code == 201, response.content
    assert response.json()["state"] == "destroyed"
    (row,) = Sandbox.objects.filter(organization=org_a)
    assert row.state == SandboxState.DESTROYED
    assert _fresh(api_a, row.pk)["state"] == "destroyed"
    assert not (warm_local.root_dir / row.provider_id).exists()
    taken = before - _warm_dirs(warm_local)
    assert len(taken) == 1  # the reserved jail is gone, not left running under another name
    assert warm_local.list_sandboxes() == []
    assert warm_local._pool.wait_full(30)
