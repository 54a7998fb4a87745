"""A metered request reads its billing period in the Redis round trip that authenticates its
API key (accounts/authentication_reads.py), not in a round trip of its own, and the plan's
limits hold exactly as when metering read it itself.

Real Redis, PostgreSQL and bubblewrap; the commands sent through common.redis_scripts (the
request path's door to Redis) are recorded on their way, and Redis still answers them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from rest_framework.test import APIClient

from accounts import keycache
from accounts.principal import Principal
from billing import metering, pricing
from common import redis_scripts
from tests.conftest import assert_error
from tests.requirements import missing_part

ECHO = {"command": "echo", "args": ["hi"]}


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch, settings: Any) -> list[bytes]:
    """Every command sent through common.redis_scripts, as sent (RESP)."""
    if not settings.REDIS_URL:
        missing_part("REDIS_URL is not set")
    commands: list[bytes] = []
    send = redis_scripts.send

    def recording(client: Any, command: bytes) -> Any:
        commands.append(command)
        return send(client, command)

    monkeypatch.setattr(redis_scripts, "send", recording)
    keycache.known_clear()
    yield commands
    keycache.known_clear()


def _name(command: bytes) -> bytes:
    """A RESP array's first element: the command's name."""
    return command.split(b"\r\n")[2]


def _period_keys(org_id: int) -> list[str]:
    meter = metering.get_meter()
    assert isinstance(meter, metering.RedisMeter)
    return meter.period_keys(org_id, pricing.period_start(datetime.now(UTC)))


def _sandbox_client(secret: str) -> tuple[APIClient, str]:
    """A client whose key this process has confirmed (served from the key cache), and the
    command path of a new sandbox."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    for _ in range(4):  # seen, then confirmed (keycache: within four requests)
        assert client.get("/api/v1/sandboxes").status_code == 200
    created = client.post("/api/v1/sandboxes", {}, format="json")
    assert created.status_code == 201, created.content
    return client, f"/api/v1/sandboxes/{created.json()['id']}/commands"


@pytest.mark.django_db
def test_a_command_reads_its_period_in_the_authentications_round_trip(  # type: ignore[no-untyped-def]
    free_org, free_key, local_sandboxes, sent
):
    client, path = _sandbox_client(free_key)
    counter = _period_keys(free_org.pk)[0]
    before = metering.get_meter().period_state(
        free_org.pk, pricing.period_start(datetime.now(UTC)), datetime.now(UTC)
    )
    sent.clear()
    ran = client.post(path, ECHO, format="json")
    assert ran.status_code == 200 and ran.json()["stdout"] == "hi\n", ran.content
    names = [_name(command) for command in sent]
    assert b"MGET" not in names, names
    # The first command is the authentication's script, reading the period's counter too.
    assert names[0] == b"EVALSHA" and counter.encode() in sent[0], sent[0]
    after = metering.get_meter().period_state(
        free_org.pk, pricing.period_start(datetime.now(UTC)), datetime.now(UTC)
    )
    assert after.executions == before.executions + 1


@pytest.mark.django_db
def test_the_free_allowance_holds_on_the_count_read_with_authentication(  # type: ignore[no-untyped-def]
    free_org, free_key, local_sandboxes, sent, settings
):
    """Room for exactly one more: the first command runs, and the next request's
    authentication reads the count that command recorded and is refused (402)."""
    client, path = _sandbox_client(free_key)
    used = metering.get_meter().period_state(
        free_org.pk, pricing.period_start(datetime.now(UTC)), datetime.now(UTC)
    )
    settings.SANDPIT_FREE_MONTHLY_EXECUTIONS = used.executions + 1
    assert client.post(path, ECHO, format="json").status_code == 200
    sent.clear()
    assert_error(client.post(path, ECHO, format="json"), 402, "free_allowance_exhausted")
    assert b"MGET" not in [_name(command) for command in sent]


@pytest.mark.django_db
def test_values_read_with_authentication_are_used_once_and_only_for_their_keys(  # type: ignore[no-untyped-def]
    free_org, sent, settings
):
    """Values for this period's keys decide (a count past the allowance refuses without
    reading Redis); another period's keys are read from Redis; taken values are gone, so a
    second check in the same request reads Redis again."""
    keys = _period_keys(free_org.pk)
    used_up = str(settings.SANDPIT_FREE_MONTHLY_EXECUTIONS).encode()
    # count, seeded, no plan change, an epoch long before the period
    read = dict(zip(keys, [used_up, b"1", None, b"1"], strict=True))
    principal = Principal(organization=free_org, read=read)
    with pytest.raises(metering.FreeAllowanceExhausted):
        metering.metering_authorize(
            organization=free_org, feature="exec", read=principal.take_values
        )
    assert sent == []
    assert principal.take_values(keys) is None  # taken

    principal = Principal(organization=free_org, read=read)
    next_month = pricing.next_period_start(pricing.period_start(datetime.now(UTC)))
    metering.metering_authorize(
        organization=free_org,
        feature="exec",
        now=datetime.combine(next_month, datetime.min.time(), UTC) + timedelta(hours=1),
        read=principal.take_values,
    )
    assert [_name(command) for command in sent][:1] == [b"MGET"]
    assert principal.take_values(keys[:1]) == [used_up]  # this period's, still unused


def test_take_values_needs_every_key() -> None:
    principal = Principal(organization_id=1, read={"a": b"1", "b": None})
    assert principal.take_values([]) is None
    assert principal.take_values(["a", "c"]) is None
    assert principal.take_values(["a", "b"]) == [b"1", None]
    assert principal.take_values(["a"]) is None
