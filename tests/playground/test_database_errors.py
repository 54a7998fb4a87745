"""common/database_errors.py tells "the database cannot serve now" from a fault of ours, on
the real drivers' own errors (SQLite files, this machine's PostgreSQL)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import psycopg_pool
import pytest
from django.db import DatabaseError, InterfaceError, OperationalError, ProgrammingError

from common.database_errors import StorageFull, database_unavailable
from tests.servers import free_port


def _as_django(exc: Exception, wrapper: type[DatabaseError]) -> DatabaseError:
    """What Django raises for a driver's error: its own class, the driver's as the cause."""
    try:
        raise wrapper(*exc.args) from exc
    except DatabaseError as wrapped:
        return wrapped


def _raised(fn) -> Exception:  # type: ignore[no-untyped-def]
    with pytest.raises(Exception) as caught:
        fn()
    return caught.value


def test_sqlite_busy_is_unavailable_and_a_missing_table_is_not(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN IMMEDIATE")
    other = sqlite3.connect(path, timeout=0.05, isolation_level=None)
    busy = _raised(lambda: other.execute("INSERT INTO t VALUES (1)"))
    assert "database is locked" in str(busy)
    assert database_unavailable(_as_django(busy, OperationalError))
    assert database_unavailable(busy)
    missing = _raised(lambda: other.execute("SELECT * FROM nowhere"))
    assert isinstance(missing, sqlite3.OperationalError)
    assert not database_unavailable(_as_django(missing, OperationalError))
    holder.execute("ROLLBACK")


def test_a_sqlite_database_out_of_room_is_unavailable_and_storage_full_too(tmp_path: Path) -> None:
    connection = sqlite3.connect(tmp_path / "db.sqlite3", isolation_level=None)
    connection.execute("CREATE TABLE t (x)")
    pages = connection.execute("PRAGMA page_count").fetchone()[0]
    connection.execute(f"PRAGMA max_page_count = {pages}")  # as a disk with no block left
    full = _raised(lambda: connection.execute("INSERT INTO t VALUES (zeroblob(100000))"))
    assert "database or disk is full" in str(full)
    assert database_unavailable(_as_django(full, OperationalError))
    assert database_unavailable(StorageFull("no room left to record usage"))
    assert not database_unavailable(RuntimeError("database or disk is full"))


def test_postgres_unreachable_or_timed_out_is_unavailable_and_a_bad_query_is_not() -> None:
    nobody = _raised(lambda: psycopg.connect(f"host=127.0.0.1 port={free_port()} user=postgres"))
    assert database_unavailable(_as_django(nobody, OperationalError))
    with psycopg.connect("host=127.0.0.1 port=5432 user=postgres", autocommit=True) as conn:
        conn.execute("SET statement_timeout = 50")
        slow = _raised(lambda: conn.execute("SELECT pg_sleep(2)"))
        assert database_unavailable(_as_django(slow, OperationalError))
        wrong = _raised(lambda: conn.execute("SELEC 1"))
        assert not database_unavailable(_as_django(wrong, ProgrammingError))
        absent = _raised(lambda: conn.execute("SELECT * FROM no_such_table_here"))
        assert not database_unavailable(_as_django(absent, ProgrammingError))
    with psycopg_pool.ConnectionPool(
        "host=127.0.0.1 port=5432 user=postgres", min_size=1, max_size=1, timeout=0.2
    ) as pool:
        with pool.connection():
            exhausted = _raised(lambda: pool.getconn())
        assert isinstance(exhausted, psycopg_pool.PoolTimeout)
        assert database_unavailable(_as_django(exhausted, OperationalError))


def test_errors_that_are_not_the_databases_are_not_unavailable() -> None:
    assert not database_unavailable(ValueError("locked"))
    assert not database_unavailable(OperationalError("database is locked"))  # no driver cause
    assert database_unavailable(InterfaceError("connection already closed"))
