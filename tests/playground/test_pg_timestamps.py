"""common/pg_timestamps.py: psycopg's compiled loader reads timestamps exactly as Django's
own loader does, on every connection where that holds, and nowhere else."""

from __future__ import annotations

import datetime

import psycopg
import pytest
from django.db import DataError, connection
from django.db.backends.postgresql.psycopg_any import register_tzloader
from django.test import override_settings
from psycopg.pq import Format

from common.pg_timestamps import (
    PSYCOPG_TIMESTAMPTZ_LOADER,
    TIMESTAMPTZ_OID,
    UtcTimestamptzLoader,
    use_psycopg_timestamptz_loader,
)
from sandboxes.models import Sandbox
from tests.requirements import missing_part

pytestmark = pytest.mark.django_db

LITERALS = [
    "2026-12-03 07:03:20.982715+00",
    "2026-01-01 00:00:00-05",
    "2000-02-29 12:00:00.5+05:30",
    "1969-12-31 23:59:59.000001+00",
    "2026-03-29 02:30:00 Europe/Paris",
    "0001-01-01 00:00:00+00",
    "9999-12-31 23:59:59.999999+00",
    "1900-01-01 00:00:00+00:19:32",
]
OUT_OF_RANGE = ["infinity", "-infinity", "10000-01-01 00:00:00+00"]


@pytest.fixture
def postgres():
    if connection.vendor != "postgresql":
        missing_part("these tests read timestamps from PostgreSQL (DATABASE_URL)")
    connection.ensure_connection()
    return connection


def _load(literal: str, *, djangos: bool) -> datetime.datetime:
    with connection.cursor() as cursor:
        if djangos:
            register_tzloader(connection.timezone, cursor.cursor)
        cursor.execute("SELECT %s::timestamptz", [literal])
        return cursor.fetchone()[0]


def test_connections_use_the_compiled_loader(postgres):
    loader = postgres.connection.adapters.get_loader(TIMESTAMPTZ_OID, Format.TEXT)
    assert loader is UtcTimestamptzLoader
    # psycopg[binary] is a dependency: without its compiled loader this gains nothing.
    assert PSYCOPG_TIMESTAMPTZ_LOADER.__module__.startswith("psycopg_binary")


def test_every_value_is_djangos(postgres):
    for literal in LITERALS:
        ours, djangos = _load(literal, djangos=False), _load(literal, djangos=True)
        assert ours == djangos, literal
        assert ours.tzinfo is djangos.tzinfo is datetime.UTC, literal
        assert ours.isoformat() == djangos.isoformat(), literal


def test_out_of_range_values_fail_alike(postgres):
    for literal in OUT_OF_RANGE:
        errors = []
        for djangos in (False, True):
            with pytest.raises(DataError) as raised:
                _load(literal, djangos=djangos)
            errors.append((type(raised.value.__cause__), str(raised.value)))
        assert errors[0] == errors[1], literal
        assert errors[0][0] is psycopg.DataError, literal


def test_a_row_reads_the_same_through_either_loader(postgres, org_a):
    created = Sandbox.objects.create(
        organization=org_a,
        provider="local",
        template="default",
        timeout_s=60,
        expires_at=datetime.datetime(2027, 1, 1, tzinfo=datetime.UTC),
    )
    Sandbox.objects.filter(pk=created.pk).update(
        started_at=datetime.datetime(2026, 12, 3, 7, 3, 20, 982715, tzinfo=datetime.UTC)
    )
    ours = Sandbox.objects.get(pk=created.pk)
    register_tzloader(connection.timezone, postgres.connection)  # Django's, as before
    try:
        djangos = Sandbox.objects.get(pk=created.pk)
    finally:
        assert use_psycopg_timestamptz_loader(postgres)
    for field in Sandbox._meta.concrete_fields:
        assert getattr(ours, field.attname) == getattr(djangos, field.attname), field.name


def test_another_session_zone_keeps_djangos_loader(postgres):
    raw = postgres.connection
    try:
        with postgres.cursor() as cursor:
            cursor.execute("SET TIME ZONE 'Europe/Paris'")
        register_tzloader(connection.timezone, raw)
        assert not use_psycopg_timestamptz_loader(postgres)
        assert raw.adapters.get_loader(TIMESTAMPTZ_OID, Format.TEXT) is not UtcTimestamptzLoader
        # Django's loader answers in UTC whatever the session's zone; so does the connection.
        assert _load(LITERALS[0], djangos=False).tzinfo is datetime.UTC
    finally:
        with postgres.cursor() as cursor:
            cursor.execute("SET TIME ZONE 'UTC'")
        assert use_psycopg_timestamptz_loader(postgres)


def test_naive_or_zoned_django_keeps_djangos_loader(postgres):
    raw = postgres.connection
    try:
        register_tzloader(None, raw)
        with override_settings(USE_TZ=False):
            assert not use_psycopg_timestamptz_loader(postgres)
        assert raw.adapters.get_loader(TIMESTAMPTZ_OID, Format.TEXT) is not UtcTimestamptzLoader
    finally:
        assert use_psycopg_timestamptz_loader(postgres)


def test_not_postgresql_is_left_alone():
    from django.db import connections

    sqlite = connections.create_connection("default")
    sqlite.vendor = "sqlite"  # the receiver reads only the vendor before giving up
    assert not use_psycopg_timestamptz_loader(sqlite)
