"""Ways around the counting rule that were found and closed: an Idempotency-Key reused after
its record was purged, and teardown refused to an organization past its allowance."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from accounts.models import Organization
from billing.services import idempotency_purge
from tests.conftest import _client, assert_error

pytestmark = pytest.mark.django_db(transaction=True)


def _executions(api) -> int:  # type: ignore[no-untyped-def]
    response = api.get("/api/v1/usage")
    assert response.status_code == 200, response.content
    return int(response.json()["executions"])


@pytest.fixture
def free_api(free_key):  # type: ignore[no-untyped-def]
    return _client(free_key)


@pytest.fixture
def free_sandbox(free_api, local_sandboxes) -> str:  # type: ignore[no-untyped-def]
    response = free_api.post("/api/v1/sandboxes", {}, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def test_an_idempotency_key_reused_after_the_purge_is_counted_again(free_api, free_sandbox):  # type: ignore[no-untyped-def]
    url = f"/api/v1/sandboxes/{free_sandbox}/commands"
    body = {"command": "echo once"}
    before = _executions(free_api)
    first = free_api.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="nightly-1")
    assert first.status_code == 200, first.content
    replay = free_api.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="nightly-1")
    assert replay["Idempotent-Replayed"] == "true"
    assert _executions(free_api) == before + 1

    assert idempotency_purge(before=timezone.now() + timedelta(seconds=1)) >= 1
    again = free_api.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="nightly-1")
    assert again.status_code == 200 and "Idempotent-Replayed" not in again
    assert _executions(free_api) == before + 2


def test_past_the_allowance_destroying_stopping_and_usage_still_work(  # type: ignore[no-untyped-def]
    settings, free_api, free_sandbox
):
    started = free_api.post(
        f"/api/v1/sandboxes/{free_sandbox}/processes",
        {"command": "sleep", "args": ["600"]},
        format="json",
    )
    assert started.status_code == 201, started.content
    pid = started.json()["pid"]
    settings.SANDPIT_FREE_MONTHLY_EXECUTIONS = _executions(free_api)

    assert_error(
        free_api.post(
            f"/api/v1/sandboxes/{free_sandbox}/commands", {"command": "true"}, format="json"
        ),
        402,
        "free_allowance_exhausted",
    )
    # A catchable signal could trigger more work in the sandbox: still refused.
    assert_error(
        free_api.post(
            f"/api/v1/sandboxes/{free_sandbox}/processes/{pid}/signal",
            {"signal": "SIGUSR1"},
            format="json",
        ),
        402,
        "free_allowance_exhausted",
    )
    at_limit = _executions(free_api)
    killed = free_api.post(
        f"/api/v1/sandboxes/{free_sandbox}/processes/{pid}/signal",
        {"signal": "SIGKILL"},
        format="json",
    )
    assert killed.status_code == 200, killed.content
    destroyed = free_api.delete(f"/api/v1/sandboxes/{free_sandbox}")
    assert destroyed.status_code == 200, destroyed.content
    assert destroyed.json()["state"] == "destroyed"
    # Allowed, and not counted past the allowance.
    assert _executions(free_api) == at_limit


def test_past_a_premium_spending_cap_destroying_still_works(org_a, api_a, local_sandboxes):  # type: ignore[no-untyped-def]
    created = api_a.post("/api/v1/sandboxes", {}, format="json")
    assert created.status_code == 201, created.content
    sandbox_id = created.json()["id"]
    Organization.objects.filter(pk=org_a.pk).update(spending_cap_cents=100)

    assert_error(api_a.get(f"/api/v1/sandboxes/{sandbox_id}/files"), 402, "spending_cap_reached")
    destroyed = api_a.delete(f"/api/v1/sandboxes/{sandbox_id}")
    assert destroyed.status_code == 200, destroyed.content
    assert api_a.get("/api/v1/usage").status_code == 200


# --- streaming exec: stdin -----------------------------------------------------------------


async def _next(ws, kind: str) -> dict:  # type: ignore[no-untyped-def]
    """The next message of one type on the exec socket (others skipped)."""
    while True:
        message = await ws.receive_json_from(timeout=20)
        if message["type"] == kind:
            return message


async def _stdout_until(ws, text: str) -> str:  # type: ignore[no-untyped-def]
    seen = ""
    while text not in seen:
        message = await ws.receive_json_from(timeout=20)
        if message["type"] == "stdout":
            seen += message["data"]
    return seen


def test_exec_stdin_is_counted_and_refused_past_the_allowance(  # type: ignore[no-untyped-def]
    settings, free_api, free_key, free_sandbox
):
    from asgiref.sync import async_to_sync
    from channels.db import database_sync_to_async
    from channels.testing import WebsocketCommunicator

    from playground.asgi import application

    settings.SANDPIT_FREE_MONTHLY_EXECUTIONS = 1000

    async def session() -> tuple[dict, str, dict]:
        ws = WebsocketCommunicator(
            application,
            f"/ws/sandboxes/{free_sandbox}/exec",
            headers=[(b"authorization", f"Bearer {free_key}".encode())],
        )
        connected, _ = await ws.connect()
        assert connected
        # A shell reading commands from its stdin: every line is a command.
        await ws.send_json_to({"type": "run", "id": "sh", "command": "sh"})
        await _next(ws, "started")
        await ws.send_json_to({"type": "stdin", "id": "sh", "data": "echo first-$((20+1))\n"})
        await _stdout_until(ws, "first-21")
        used = await database_sync_to_async(_executions)(free_api)
        settings.SANDPIT_FREE_MONTHLY_EXECUTIONS = used
        await ws.send_json_to({"type": "stdin", "id": "sh", "data": "echo refused-$((20+2))\n"})
        refused = await _next(ws, "error")
        settings.SANDPIT_FREE_MONTHLY_EXECUTIONS = used + 1
        await ws.send_json_to({"type": "stdin", "id": "sh", "data": "echo after-$((20+3))\n"})
        output = await _stdout_until(ws, "after-23")
        await ws.send_json_to({"type": "cancel", "id": "sh"})
        await _next(ws, "exit")
        await ws.disconnect()
        return refused, output, {"used": used}

    before = _executions(free_api)
    refused, output, state = async_to_sync(session)()
    assert refused["code"] == "free_allowance_exhausted" and refused["id"] == "sh"
    assert refused["status"] == 402
    # The refused line never reached the shell; the run and both accepted lines counted.
    assert "refused-22" not in output
    assert state["used"] == before + 2
    assert _executions(free_api) == before + 3


# --- terminals: commands without an Enter ------------------------------------------------------


async def _terminal_until(ws, pattern: bytes, seen: list[bytes]) -> None:  # type: ignore[no-untyped-def]
    while pattern not in b"".join(seen):
        message = await ws.receive_output(timeout=20)
        if message.get("bytes"):
            seen.append(message["bytes"])


def test_terminal_commands_without_enter_are_counted_per_started_minute(  # type: ignore[no-untyped-def]
    monkeypatch, api_a, key_a, local_sandboxes
):
    import asyncio

    from asgiref.sync import async_to_sync, sync_to_async
    from channels.testing import WebsocketCommunicator

    from playground.asgi import application
    from sandboxes import terminals
    from sandboxes.terminals import terminal_manager

    clock = [1000.0]
    monkeypatch.setattr(terminals, "meter_clock", lambda: clock[0])
    created = api_a.post("/api/v1/sandboxes", {}, format="json")
    assert created.status_code == 201, created.content
    sandbox_id = created.json()["id"]
    auth = (b"authorization", f"Bearer {key_a}".encode())

    async def session() -> None:
        # Terminals read their PTY on the server's loop: here, this one. The REST call runs
        # on the test's thread (thread-sensitive), with the test's database connection.
        terminal_manager.bind_loop(asyncio.get_running_loop())
        made = await sync_to_async(api_a.post)(
            f"/api/v1/sandboxes/{sandbox_id}/terminals", {"shell": "/bin/bash"}, format="json"
        )
        assert made.status_code == 201, made.content
        ws = WebsocketCommunicator(application, made.json()["ws_path"], [auth])
        assert (await ws.connect())[0]
        seen: list[bytes] = []
        await _terminal_until(ws, b"$ ", seen)
        # Minute 1: bash's Ctrl-O (operate-and-get-next) runs the line without an Enter,
        # then one Enter starts a loop that runs every ';'-terminated input as a command.
        await ws.send_to(bytes_data=b"echo ctrl-$((40+2))\x0f")
        await _terminal_until(ws, b"ctrl-42", seen)
        await ws.send_to(bytes_data=b"\x15while read -r -d ';' c; do eval \"$c\"; done\r")
        await ws.send_to(bytes_data=b"echo loop-$((50+1));")
        await _terminal_until(ws, b"loop-51", seen)
        # Minutes 2 and 3: commands through the loop, never an Enter.
        clock[0] += 60
        await ws.send_to(bytes_data=b"echo loop-$((50+2));")
        await ws.send_to(bytes_data=b"echo loop-$((50+3));")
        await _terminal_until(ws, b"loop-53", seen)
        clock[0] += 60
        await ws.send_to(bytes_data=b"echo loop-$((50+4));")
        await _terminal_until(ws, b"loop-54", seen)
        await ws.disconnect()  # records what is still unflushed

    before = _executions(api_a)
    async_to_sync(session)()
    # terminal.create, then max(1, Enters) for each of the three minutes with input.
    assert _executions(api_a) == before + 1 + 3
