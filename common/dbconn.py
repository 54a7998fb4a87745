"""Database connections while a request waits on something else.

A request's connection stays checked out of the pool (DJANGO_DB_POOL_MAX per process) until
the request ends. A request that spends most of its time waiting on a sandbox (a create
waits for the jail's agent, a command for its exit) would hold one all along, so 100 creates
at once queued behind 20 connections (profiled with py-spy: 55% of the burst's thread time
was spent in the pool's getconn). `release_idle_connection()` puts it back before such a
wait; the next query takes one again (about 20 µs from a warm pool).
"""

from __future__ import annotations

from django.db import DEFAULT_DB_ALIAS, connections


def release_idle_connection(using: str = DEFAULT_DB_ALIAS) -> bool:
    """Return this thread's pooled connection to the pool, unless a transaction is open
    (closing would roll it back) or the database has no pool (closing would cost a new
    connection, or a SQLite file reopen, on the next query). Returns whether it did."""
    connection = connections[using]
    if connection.connection is None or connection.in_atomic_block:
        return False
    if not connection.settings_dict.get("OPTIONS", {}).get("pool"):
        return False
    connection.close()
    return True
