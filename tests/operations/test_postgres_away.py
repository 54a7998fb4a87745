"""PostgreSQL going away under a live server and coming back, as a restart or a failover
does: the server's connections are terminated and its role may not connect for a while.
While it is away, requests that need the database answer 503 `database_unavailable` with
Retry-After (never a 500 and a traceback); once it is back, the same requests succeed
without restarting anything.

The server connects as a role of its own (not a superuser: PostgreSQL does not apply a
connection limit to those), so the test can shut it out without touching the suite's
other connections."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from django.db import connection

from tests.requirements import missing_part
from tests.servers import serving_test_database

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def server_role() -> Iterator[str]:
    if connection.vendor != "postgresql":
        missing_part("needs PostgreSQL")
    role = f"sandpit_away_{uuid.uuid4().hex[:8]}"
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE ROLE {role} LOGIN")
        cursor.execute(f"GRANT pg_read_all_data, pg_write_all_data TO {role}")
    try:
        yield role
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                [role],
            )
            cursor.execute(f"DROP ROLE IF EXISTS {role}")


def _shut_out(role: str, away: bool) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER ROLE {role} CONNECTION LIMIT {0 if away else -1}")
        if away:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                [role],
            )


def test_requests_answer_503_while_postgres_is_away_and_succeed_once_it_is_back(
    settings, tmp_path: Path, server_role: str, key_a: str
) -> None:
    db = connection.settings_dict
    url = f"postgres://{server_role}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    log = tmp_path / "server.log"
    with serving_test_database(
        settings,
        log,
        module="playground.webserver",
        DATABASE_URL=url,
        DJANGO_DB_POOL_TIMEOUT_S="2",
        SANDPIT_LOG_LEVEL="INFO",
    ) as (base, _):
        api = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key_a}"}, timeout=30)
        assert api.get("/api/v1/sandboxes").status_code == 200

        _shut_out(server_role, away=True)
        answers = [api.get("/api/v1/sandboxes") for _ in range(4)]
        answers.append(api.get("/api/v1/usage"))
        for answer in answers:
            assert answer.status_code == 503, (answer.status_code, answer.text[:300])
            assert answer.json()["error"]["code"] == "database_unavailable"
            assert answer.headers["Retry-After"] == "1"

        _shut_out(server_role, away=False)
        deadline = time.monotonic() + 30
        while (back := api.get("/api/v1/sandboxes")).status_code != 200:
            assert back.status_code == 503, back.text[:300]
            assert time.monotonic() < deadline, "the server did not reconnect"
            time.sleep(0.5)
        assert api.get("/api/v1/usage").status_code == 200
    output = log.read_text()
    assert "Database unavailable (answered 503)" in output
    assert "Traceback" not in output, output[output.index("Traceback") - 300 :][:3000]
