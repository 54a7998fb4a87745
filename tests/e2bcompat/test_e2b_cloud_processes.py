"""The E2B layer's processes on a provider without Sandpit's agent (the e2b provider, on
tests/cloud/fake_e2b.py): they stay in the web process that started them
(e2bcompat.processes.local_processes), and list, stdin, close_stdin and the end of a
command or PTY (numbered from PTY_PID_BASE) work there, in process through the E2B
router."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import uuid
from datetime import timedelta
from typing import Any

import httpx
import pytest
from asgiref.sync import async_to_sync
from django.utils import timezone

from e2bcompat.asgi import E2BRouter
from e2bcompat.processes import PTY_PID_BASE, local_processes
from sandboxes import providers
from sandboxes.models import Sandbox, SandboxState
from sandboxes.providers.base import SandboxSpec
from tests.cloud.conftest import e2b_provider, fake_e2b_cloud  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cloud_sandbox(e2b_provider, org_a, settings, monkeypatch):  # type: ignore[no-untyped-def]  # noqa: F811
    settings.SANDPIT_PROVIDERS = ["local", "e2b"]
    monkeypatch.setitem(providers._instances, "e2b", e2b_provider)
    handle = e2b_provider.create(SandboxSpec(sandbox_id=uuid.uuid4().hex))
    sandbox = Sandbox.objects.create(
        organization=org_a,
        provider="e2b",
        provider_id=handle.provider_id,
        state=SandboxState.RUNNING,
        timeout_s=300,
        expires_at=timezone.now() + timedelta(minutes=5),
    )
    yield sandbox
    e2b_provider.destroy(handle.provider_id)


def _envelope(message: dict[str, Any]) -> bytes:
    body = json.dumps(message).encode()
    return struct.pack(">BI", 0, len(body)) + body


def _messages(raw: bytes) -> list[dict[str, Any]]:
    found = []
    while raw:
        flags, size = struct.unpack(">BI", raw[:5])
        found.append({"end_stream": bool(flags & 2), **json.loads(raw[5 : 5 + size] or b"{}")})
        raw = raw[5 + size :]
    return found


async def _not_rpc(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError(f"not routed to the RPC services: {scope['path']}")


def test_a_cloud_providers_command_lives_in_the_process_that_started_it(cloud_sandbox, key_a):  # type: ignore[no-untyped-def]
    headers = {"X-API-Key": key_a, "E2b-Sandbox-Id": cloud_sandbox.id}

    async def scenario() -> tuple[list[dict[str, Any]], dict[str, Any]]:
        transport = httpx.ASGITransport(app=E2BRouter(_not_rpc))
        async with httpx.AsyncClient(
            transport=transport, base_url="http://sandpit", timeout=30
        ) as client:

            async def unary(method: str, body: dict[str, Any]) -> dict[str, Any]:
                response = await client.post(
                    f"/e2b/process.Process/{method}",
                    content=json.dumps(body),
                    headers={**headers, "Content-Type": "application/json"},
                )
                assert response.status_code == 200, response.text
                return response.json()  # type: ignore[no-any-return]

            # The start stream answers only once the command ends (the transport buffers it).
            start = asyncio.ensure_future(
                client.post(
                    "/e2b/process.Process/Start",
                    content=_envelope(
                        {"process": {"cmd": "/bin/sh", "args": ["-c", "cat"]}, "stdin": True}
                    ),
                    headers={**headers, "Content-Type": "application/connect+json"},
                )
            )
            for _ in range(200):
                if local_processes.for_sandbox(cloud_sandbox.id):
                    break
                await asyncio.sleep(0.05)
            listed = await unary("List", {})
            pid = listed["processes"][0]["pid"]
            data = {"stdin": "aGVsbG8K"}  # "hello\n"
            await unary("SendInput", {"process": {"pid": pid}, "input": data})
            await unary("CloseStdin", {"process": {"pid": pid}})
            response = await start
            assert response.status_code == 200, response.text
            after = await unary("List", {})
            return _messages(response.content), {"listed": listed, "after": after}

    events, lists = async_to_sync(scenario)()
    assert [p["config"]["cmd"] for p in lists["listed"]["processes"]] == ["/bin/sh"]
    output = b"".join(
        base64.b64decode(e["event"]["data"]["stdout"])
        for e in events
        if "event" in e and "data" in e["event"]
    )
    assert output == b"hello\n"
    end = [e["event"]["end"] for e in events if "event" in e and "end" in e["event"]]
    assert end and end[0].get("status") == "exit status 0"
    assert lists["after"].get("processes", []) == []
    assert local_processes.for_sandbox(cloud_sandbox.id) == []


def test_a_cloud_providers_pty_gets_a_pid_of_its_own_and_ends_with_its_shell(  # type: ignore[no-untyped-def]
    cloud_sandbox, key_a
):
    headers = {"X-API-Key": key_a, "E2b-Sandbox-Id": cloud_sandbox.id}

    async def scenario() -> tuple[list[dict[str, Any]], int]:
        transport = httpx.ASGITransport(app=E2BRouter(_not_rpc))
        async with httpx.AsyncClient(
            transport=transport, base_url="http://sandpit", timeout=30
        ) as client:
            start = asyncio.ensure_future(
                client.post(
                    "/e2b/process.Process/Start",
                    content=_envelope(
                        {
                            "process": {"cmd": "/bin/sh"},
                            "pty": {"size": {"cols": 80, "rows": 24}},
                        }
                    ),
                    headers={**headers, "Content-Type": "application/connect+json"},
                )
            )
            for _ in range(200):
                if local_processes.for_sandbox(cloud_sandbox.id):
                    break
                await asyncio.sleep(0.05)
            (process,) = local_processes.for_sandbox(cloud_sandbox.id)
            typed = {"pty": base64.b64encode(b"echo pty-$((6*7)); exit 3\n").decode()}
            response = await client.post(
                "/e2b/process.Process/SendInput",
                content=json.dumps({"process": {"pid": process.pid}, "input": typed}),
                headers={**headers, "Content-Type": "application/json"},
            )
            assert response.status_code == 200, response.text
            ended = await start
            assert ended.status_code == 200, ended.text
            return _messages(ended.content), process.pid

    events, pid = async_to_sync(scenario)()
    assert pid >= PTY_PID_BASE
    output = b"".join(
        base64.b64decode(e["event"]["data"]["pty"])
        for e in events
        if "event" in e and "data" in e["event"]
    )
    assert b"pty-42" in output
    end = [e["event"]["end"] for e in events if "event" in e and "end" in e["event"]]
    assert end and end[0].get("exitCode") == 3
    assert local_processes.for_sandbox(cloud_sandbox.id) == []
