"""Sandbox bookkeeping in fewer round trips (sandboxes/provider_access.py): a state change on
its own is one statement sent once, committed without waiting for the WAL flush; a create's
lock, count and insert are one round trip and still serialize two creates at the limit."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

import psycopg
import pytest
from django.conf import settings
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from sandboxes.models import Sandbox, SandboxState
from sandboxes.provider_access import FAST_COMMIT_SQL, fast_commit, sandbox_transition
from sandboxes.services import (
    CAPPED_STATES,
    capped_sandboxes_lock_and_count,
    sandbox_insert_capped,
)
from tests.requirements import missing_part


@pytest.fixture
def postgres():
    if connection.vendor != "postgresql":
        missing_part("these tests need PostgreSQL (DATABASE_URL)")


def _sandbox(organization, state=SandboxState.CREATING) -> Sandbox:  # type: ignore[no-untyped-def]
    return Sandbox.objects.create(
        organization=organization,
        provider="local",
        template="default",
        state=state,
        timeout_s=60,
        expires_at=datetime(2030, 1, 1, tzinfo=UTC),
    )


def _state_seen_elsewhere(sandbox_id: str) -> str:
    """The row's state read by a connection of its own: only what was committed."""
    params = connection.get_connection_params()
    params.pop("context", None)
    params.pop("cursor_factory", None)
    with psycopg.connect(**params, autocommit=True) as other:
        row = other.execute(
            "SELECT state FROM sandboxes_sandbox WHERE id = %s", [sandbox_id]
        ).fetchone()
    assert row is not None
    return str(row[0])


def _synchronous_commit() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        return str(cursor.fetchone()[0])


@pytest.mark.django_db(transaction=True)
def test_a_state_change_alone_is_one_statement(postgres, org_a):
    sandbox = _sandbox(org_a)
    before = _synchronous_commit()
    with CaptureQueriesContext(connection) as queries:
        won = sandbox_transition(sandbox, SandboxState.RUNNING, provider_id="p-1")
    assert won and sandbox.state == SandboxState.RUNNING
    assert len(queries) == 1
    assert queries[0]["sql"].startswith(f"{FAST_COMMIT_SQL}; UPDATE ")
    assert _state_seen_elsewhere(sandbox.pk) == SandboxState.RUNNING  # committed
    assert _synchronous_commit() == before  # the setting stayed in that statement's transaction
    # Losing (already destroyed) is a row count of 0, read from the statement, not the setting.
    Sandbox.objects.filter(pk=sandbox.pk).update(state=SandboxState.DESTROYED)
    assert not sandbox_transition(sandbox, SandboxState.PAUSED)
    assert _state_seen_elsewhere(sandbox.pk) == SandboxState.DESTROYED


@pytest.mark.django_db(transaction=True)
def test_inside_a_transaction_it_is_sent_as_before(postgres, org_a):
    sandbox = _sandbox(org_a)
    with transaction.atomic():
        with CaptureQueriesContext(connection) as queries:
            assert sandbox_transition(sandbox, SandboxState.RUNNING, provider_id="p-2")
        statements = [query["sql"] for query in queries]
        assert FAST_COMMIT_SQL in statements
        assert not any("; " in sql for sql in statements)
        assert _state_seen_elsewhere(sandbox.pk) == SandboxState.CREATING  # not yet committed
    assert _state_seen_elsewhere(sandbox.pk) == SandboxState.RUNNING


@pytest.mark.django_db(transaction=True)
def test_lock_and_count_share_a_round_trip_and_serialize_creates(postgres, org_a):
    _sandbox(org_a, SandboxState.RUNNING)
    seen: dict[str, int] = {}

    def second() -> None:
        with fast_commit(caller_sends_setting=True) as setting:
            seen["second"] = capped_sandboxes_lock_and_count(org_a.pk, prefix=setting)

    first, sql = _hold_the_lock_while(org_a, second)
    assert (first, seen["second"]) == (1, 2)  # the second counted the first's new row
    locks = [statement for statement in sql if "FOR UPDATE" in statement]
    assert len(locks) == 1 and "COUNT(*)" in locks[0]
    assert locks[0].startswith(f"{FAST_COMMIT_SQL}; SELECT 1 FROM ")  # noqa: S608 - expected text
    assert FAST_COMMIT_SQL not in sql  # not sent again on its own


def _hold_the_lock_while(organization, waiter: Callable[[], None]) -> tuple[int, list[str]]:  # type: ignore[no-untyped-def]
    """A create holding the organization's row lock in a thread, and `waiter` run in another
    once it holds it; the holder inserts a sandbox and commits only when some statement
    waits on a lock. Returns the holder's count and its statements."""
    locked, may_commit = threading.Event(), threading.Event()
    held: dict[str, int] = {}
    sql: list[str] = []

    def holder() -> None:
        try:
            with CaptureQueriesContext(connections["default"]) as queries:
                with fast_commit(caller_sends_setting=True) as setting:
                    held["count"] = capped_sandboxes_lock_and_count(organization.pk, prefix=setting)
                    locked.set()
                    may_commit.wait(30)
                    _sandbox(organization)  # a create's insert, committed with the release
            sql.extend(query["sql"] for query in queries)
        finally:
            locked.set()
            connections.close_all()

    def waiting() -> None:
        try:
            waiter()
        finally:
            connections.close_all()

    one = threading.Thread(target=holder)
    one.start()
    assert locked.wait(30)
    two = threading.Thread(target=waiting)
    two.start()
    try:
        _wait_for_a_lock_wait()  # the waiter's statement waits on the holder's row lock
    finally:
        may_commit.set()
        one.join(30)
        two.join(30)
    return held["count"], sql


def _wait_for_a_lock_wait() -> None:
    """Until some backend of this database waits on a lock (polled; no timing asserted)."""
    name = settings.DATABASES["default"]["NAME"]
    for _ in range(3000):
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()"
            )
            if cursor.fetchone()[0]:
                return
        time.sleep(0.01)
    pytest.fail(f"no statement ever waited on a lock in {name}")


def _new(organization) -> Sandbox:  # type: ignore[no-untyped-def]
    return Sandbox(
        organization=organization,
        provider="local",
        template="default",
        timeout_s=60,
        expires_at=datetime(2030, 1, 1, tzinfo=UTC),
        metadata={"quote'd": 'a"b;', "ünï": None},
    )


def _capped_count(organization) -> int:  # type: ignore[no-untyped-def]
    return Sandbox.objects.filter(organization=organization, state__in=CAPPED_STATES).count()


@pytest.mark.django_db(transaction=True)
def test_a_create_is_one_round_trip_committed_at_once(postgres, org_a):
    before = _synchronous_commit()
    sandbox = _new(org_a)
    with CaptureQueriesContext(connection) as queries:
        assert sandbox_insert_capped(sandbox, limit=1) is None
    assert len(queries) == 1, [query["sql"] for query in queries]
    statement = queries[0]["sql"]
    assert statement.startswith(f"{FAST_COMMIT_SQL}; SELECT 1 FROM ")  # noqa: S608 - expected text
    assert "FOR UPDATE" in statement and "INSERT INTO" in statement
    assert sandbox._state.adding is False
    assert _state_seen_elsewhere(sandbox.pk) == SandboxState.CREATING  # committed
    assert Sandbox.objects.get(pk=sandbox.pk).metadata == {"quote'd": 'a"b;', "ünï": None}
    assert _synchronous_commit() == before  # the setting stayed in that query's transaction


@pytest.mark.django_db(transaction=True)
def test_at_the_limit_a_create_inserts_nothing_and_says_how_many(postgres, org_a):
    _sandbox(org_a, SandboxState.RUNNING)
    _sandbox(org_a, SandboxState.PAUSED)  # holds a place
    _sandbox(org_a, SandboxState.DESTROYED)  # does not
    sandbox = _new(org_a)
    assert sandbox_insert_capped(sandbox, limit=2) == 2
    assert not Sandbox.objects.filter(pk=sandbox.pk).exists()
    assert sandbox._state.adding is True
    assert sandbox_insert_capped(sandbox, limit=3) is None
    assert _capped_count(org_a) == 3


@pytest.mark.django_db(transaction=True)
def test_inside_a_transaction_a_create_locks_counts_and_inserts_as_before(postgres, org_a):
    with transaction.atomic():
        with CaptureQueriesContext(connection) as queries:
            assert sandbox_insert_capped(_new(org_a), limit=1) is None
        statements = [query["sql"] for query in queries]
        assert any("FOR UPDATE" in sql for sql in statements)
        assert any(sql.startswith("INSERT INTO") and "VALUES" in sql for sql in statements)
        assert sandbox_insert_capped(_new(org_a), limit=1) == 1
    assert _capped_count(org_a) == 1


@pytest.mark.django_db(transaction=True)
def test_a_create_waiting_on_the_lock_counts_the_row_the_holder_inserted(postgres, org_a):
    """The insert's count is read after the lock is granted: a create that waited on another
    one, with one place left between them, must see the other's row and insert nothing."""
    _sandbox(org_a, SandboxState.RUNNING)
    result: dict[str, int | None] = {}

    def waiter() -> None:
        result["waiter"] = sandbox_insert_capped(_new(org_a), limit=2)

    _hold_the_lock_while(org_a, waiter)
    assert result == {"waiter": 2}
    assert _capped_count(org_a) == 2
