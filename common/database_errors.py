"""Which database errors mean "the database cannot serve now, retry" rather than a fault of
ours: SQLite's write lock held past its busy timeout (a slow disk, a long writer in another
process), PostgreSQL unreachable, restarting, out of connections or the pool exhausted,
a serialization failure or deadlock, a statement cancelled by its timeout.

A disk too full for the database to write (SQLite's SQLITE_FULL, PostgreSQL's disk_full)
counts too: space comes back without a change of ours, and the request can be sent again
then. So does `StorageFull`, raised before a metered operation when its usage record would
have nowhere to go.

The doors answer these 503 `database_unavailable` with Retry-After (REST, the E2B-compatible
API, plain Django views) instead of a 500 and its traceback; a usage record that meets one
after its operation ran is kept on disk instead (billing/usage_spool.py)."""

from __future__ import annotations

import sqlite3

import psycopg
from django.db import InterfaceError, OperationalError

CODE = "database_unavailable"
MESSAGE = (
    "The database cannot take this right now (busy, unreachable or out of disk space); "
    "retry in a moment."
)
RETRY_AFTER_S = 1

_SQLITE_RETRYABLE = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_FULL}
# Connection exceptions (class 08), operator intervention (57P01-03: shutting down,
# crashed, starting up), disk full, too many connections, serialization failure, deadlock,
# and a statement cancelled by statement_timeout.
_POSTGRES_RETRYABLE = {"57P01", "57P02", "57P03", "53100", "53300", "40001", "40P01", "57014"}


class StorageFull(Exception):
    """The disk that keeps usage records is (nearly) full: a metered operation is refused
    before it runs rather than run uncounted."""


def database_unavailable(exc: BaseException) -> bool:
    """Whether `exc` (as Django raises it, or the driver's own) says to retry later."""
    if isinstance(exc, StorageFull):
        return True
    if isinstance(exc, OperationalError | InterfaceError):
        cause = exc.__cause__
        if cause is None:
            return isinstance(exc, InterfaceError)  # "connection already closed"
        exc = cause
    if isinstance(exc, sqlite3.OperationalError):
        return getattr(exc, "sqlite_errorcode", None) in _SQLITE_RETRYABLE
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        # No SQLSTATE: the connection failed or the pool timed out (PoolTimeout).
        state = exc.sqlstate
        return state is None or state.startswith("08") or state in _POSTGRES_RETRYABLE
    return False
