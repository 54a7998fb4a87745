"""API keys a process has verified are confirmed in Redis, not read from the database
(accounts.keycache), and a change made anywhere is refused on the very next request.

The revocations here run in another process (`manage.py shell` on the same database and
Redis), as a second web process or an owner's browser session would make them."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from accounts import keycache
from accounts.models import ApiKey, Organization
from accounts.principal import Principal
from accounts.services import api_key_create, api_key_revoke
from tests.conftest import assert_error
from tests.other_process import run_in_another_process
from tests.requirements import missing_part


@pytest.fixture(autouse=True)
def _own_generations(settings):  # type: ignore[no-untyped-def]
    """Generations and the epoch under a prefix of this test's own (Redis outlives tests)."""
    if not settings.REDIS_URL:
        missing_part("REDIS_URL is not set")
    cache = {**settings.CACHES["default"], "KEY_PREFIX": f"test-keycache-{uuid.uuid4().hex}"}
    settings.CACHES = {**settings.CACHES, "default": cache}
    keycache.known_clear()
    yield
    keycache.known_clear()


def _client(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def _key_queries(client: APIClient, path: str) -> tuple[int, int]:
    """(status, queries that read the API key table) of one GET."""
    with CaptureQueriesContext(connection) as queries:
        status = client.get(path).status_code
    return status, sum(
        q["sql"].startswith("SELECT") and '"accounts_apikey"' in q["sql"]
        for q in queries.captured_queries
    )


def _warm(client: APIClient, path: str) -> None:
    """Seen once (stored unconfirmed), then confirmed (after the epoch is written, when this
    Redis prefix has none yet): within four requests the key is served from the cache."""
    seen = [_key_queries(client, path) for _ in range(4)]
    assert seen[0] == (200, 1) and seen[-1] == (200, 0), seen


@pytest.mark.django_db(transaction=True)
def test_a_key_revoked_in_another_process_is_refused_at_once(org_a):  # type: ignore[no-untyped-def]
    issued = api_key_create(organization=org_a, name="ci")
    client = _client(issued.secret)
    _warm(client, "/api/v1/sandboxes")
    run_in_another_process(
        "from accounts.models import ApiKey; from accounts.services import api_key_revoke; "
        f"api_key_revoke(api_key=ApiKey.objects.get(pk={issued.api_key.pk}))"
    )
    assert_error(client.get("/api/v1/sandboxes"), 401, "authentication_failed")


@pytest.mark.django_db(transaction=True)
def test_a_key_whose_organization_another_process_deleted_is_refused_at_once():  # type: ignore[no-untyped-def]
    doomed = Organization.objects.create(name="Doomed", slug="doomed", plan="premium")
    issued = api_key_create(organization=doomed, name="ci")
    client = _client(issued.secret)
    _warm(client, "/api/v1/sandboxes")
    run_in_another_process(
        f"from accounts.models import Organization; Organization.objects.get(pk={doomed.pk}).delete()"
    )
    assert_error(client.get("/api/v1/sandboxes"), 401, "authentication_failed")


@pytest.mark.django_db
def test_a_change_saved_in_this_process_is_seen_at_once(org_a):  # type: ignore[no-untyped-def]
    issued = api_key_create(organization=org_a, name="ci")
    client = _client(issued.secret)
    _warm(client, "/api/v1/sandboxes")
    api_key_revoke(api_key=ApiKey.objects.get(pk=issued.api_key.pk))
    assert_error(client.get("/api/v1/sandboxes"), 401, "authentication_failed")


@pytest.mark.django_db
def test_a_cached_key_still_expires_and_a_wrong_secret_is_never_cached(org_a):  # type: ignore[no-untyped-def]
    issued = api_key_create(
        organization=org_a, name="ci", expires_at=timezone.now() + timedelta(hours=1)
    )
    client = _client(issued.secret)
    _warm(client, "/api/v1/sandboxes")
    tampered = issued.secret[:-4] + ("AAAA" if not issued.secret.endswith("AAAA") else "BBBB")
    for _ in range(3):
        assert_error(_client(tampered).get("/api/v1/sandboxes"), 401)
    assert keycache.known_get(keycache.digest(tampered)) is None
    # The hour has passed, as far as the cached entry knows.
    found_by = keycache.digest(issued.secret)
    entry = keycache.known_get(found_by)
    assert entry is not None
    keycache.known_replace(found_by, entry.with_field("expires_at", timezone.now()))
    assert_error(client.get("/api/v1/sandboxes"), 401)


@pytest.mark.django_db
def test_redis_losing_its_data_makes_every_process_read_keys_again(org_a):  # type: ignore[no-untyped-def]
    issued = api_key_create(organization=org_a, name="ci")
    client = _client(issued.secret)
    _warm(client, "/api/v1/sandboxes")
    keys = keycache.generation_keys(issued.api_key.prefix)
    keycache._client().delete(*keys)  # a Redis restarted without its data
    # The revocation that Redis lost: written straight to the table (no generation).
    ApiKey.objects.filter(pk=issued.api_key.pk).update(revoked_at=issued.api_key.created_at)
    assert_error(client.get("/api/v1/sandboxes"), 401)


@pytest.mark.django_db
def test_without_redis_every_request_reads_the_key(org_a, settings):  # type: ignore[no-untyped-def]
    settings.REDIS_URL = ""
    issued = api_key_create(organization=org_a, name="ci")
    client = _client(issued.secret)
    for _ in range(3):
        assert _key_queries(client, "/api/v1/sandboxes") == (200, 1)


@pytest.mark.django_db
def test_a_principal_loads_the_row_the_orm_loads(org_a):  # type: ignore[no-untyped-def]
    """Principal.organization writes its statement once (accounts/principal.py): the same
    row, field by field, as Organization.objects.get; a missing id raises DoesNotExist."""
    Organization.objects.filter(pk=org_a.pk).update(spending_cap_cents=1234, plan="free")
    loaded = Principal(organization_id=org_a.pk).organization
    expected = Organization.objects.get(pk=org_a.pk)
    for field in Organization._meta.concrete_fields:
        assert getattr(loaded, field.attname) == getattr(expected, field.attname), field.name
    assert loaded._state.adding is False and loaded._state.db == "default"
    with pytest.raises(Organization.DoesNotExist):
        _ = Principal(organization_id=org_a.pk + 10_000).organization


@pytest.mark.django_db
def test_a_command_reads_the_organization_only_with_its_sandbox(org_a, local_sandboxes):  # type: ignore[no-untyped-def]
    """A cached key knows only its organization's id; a metered command gets the row joined
    to its sandbox's lookup (sandboxes/selectors.py), read afresh on every request."""
    issued = api_key_create(organization=org_a, name="ci")
    client = _client(issued.secret)
    _warm(client, "/api/v1/sandboxes")
    created = client.post("/api/v1/sandboxes", {}, format="json")
    assert created.status_code == 201, created.content
    path = f"/api/v1/sandboxes/{created.json()['id']}/commands"
    echo = {"command": "echo", "args": ["hi"]}
    with CaptureQueriesContext(connection) as queries:
        ran = client.post(path, echo, format="json")
    assert ran.status_code == 200 and ran.json()["stdout"] == "hi\n", ran.content
    reads = [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].startswith("SELECT") and '"accounts_organization"' in q["sql"]
    ]
    assert len(reads) == 1 and '"sandboxes_sandbox"' in reads[0], reads
    # Never remembered between requests: a cap below the base fee, set just now behind the
    # model's back, refuses the very next command.
    Organization.objects.filter(pk=org_a.pk).update(spending_cap_cents=1)
    assert_error(client.post(path, echo, format="json"), 402, "spending_cap_reached")


@pytest.mark.django_db
def test_a_read_of_a_sandbox_does_not_read_its_organization(org_a, local_sandboxes):  # type: ignore[no-untyped-def]
    issued = api_key_create(organization=org_a, name="ci")
    client = _client(issued.secret)
    _warm(client, "/api/v1/sandboxes")
    created = client.post("/api/v1/sandboxes", {}, format="json")
    assert created.status_code == 201, created.content
    for suffix in ("", "/stats"):  # neither is billed
        with CaptureQueriesContext(connection) as queries:
            read = client.get(f"/api/v1/sandboxes/{created.json()['id']}{suffix}")
        assert read.status_code == 200, read.content
        statements = [q["sql"] for q in queries.captured_queries]
        assert not any('"accounts_organization"' in sql for sql in statements), statements
