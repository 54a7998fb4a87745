"""PostgreSQL `timestamptz` values read by psycopg's compiled loader.

Django registers a `timestamptz` loader of its own on every psycopg 3 connection, to give
values the zone it expects. It subclasses psycopg's pure-Python loader, so each value is
parsed in Python and then has its zone replaced: a sandbox row has five such columns, and
they were 40 µs of the 175 µs of CPU its lookup cost (a list of 100 sandboxes: 500
values). When Django expects UTC (USE_TZ without a database TIME_ZONE) and the session's
zone is UTC, psycopg's own loader (compiled when psycopg's binary package is installed)
returns the same value: an aware datetime in `datetime.timezone.utc`. On such a connection
this module registers that loader instead, under the `timezone` attribute Django's cursor
factory compares with its own before registering its loader again on a cursor.

A session whose zone changes later (SET TIME ZONE) still reads correct instants, in the
session's zone rather than in UTC.
"""

from __future__ import annotations

import datetime
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

try:
    import psycopg
    from psycopg.adapt import Buffer, Loader
    from psycopg.pq import Format
except ImportError:  # psycopg2 or no PostgreSQL driver: nothing to do
    psycopg = None  # type: ignore[assignment]


if psycopg is not None:
    TIMESTAMPTZ_OID = psycopg.postgres.types["timestamptz"].oid
    # The global map hands out the compiled class when psycopg's binary package is present.
    PSYCOPG_TIMESTAMPTZ_LOADER: type[Any] = psycopg.adapters.get_loader(
        TIMESTAMPTZ_OID, Format.TEXT
    )  # type: ignore[assignment]

    class UtcTimestamptzLoader(Loader):
        """psycopg's `timestamptz` loader, with the attribute Django's cursor factory reads.
        The compiled class cannot be subclassed, so it is wrapped."""

        timezone = datetime.UTC

        def __init__(self, oid: int, context: Any = None) -> None:
            super().__init__(oid, context)
            self._loader = PSYCOPG_TIMESTAMPTZ_LOADER(oid, context)

        def load(self, data: Buffer) -> datetime.datetime:
            value: datetime.datetime = self._loader.load(data)
            return value


def use_psycopg_timestamptz_loader(connection: BaseDatabaseWrapper) -> bool:
    """Register psycopg's loader on `connection` when it returns what Django's would (see
    the module's docstring). Returns whether the connection now uses it."""
    if psycopg is None or connection.vendor != "postgresql":
        return False
    raw = connection.connection
    if not isinstance(raw, psycopg.Connection):
        return False
    if connection.timezone is not datetime.UTC:
        return False  # Django expects another zone (or naive values: USE_TZ off)
    if raw.info.timezone is not datetime.UTC:
        return False  # the session is in another zone
    if raw.adapters.get_loader(TIMESTAMPTZ_OID, Format.TEXT) is not UtcTimestamptzLoader:
        raw.adapters.register_loader(TIMESTAMPTZ_OID, UtcTimestamptzLoader)
    return True


def on_connection_created(sender: object, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    """`connection_created` receiver (connected in playground's AppConfig.ready)."""
    use_psycopg_timestamptz_loader(connection)
