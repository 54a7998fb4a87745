"""How often an API request crosses from the event loop to its request thread, through the
product's whole ASGI application as the web server runs it (playground/webthreads.py):
once, for the view. Each crossing is a wake-up of another thread and two GIL hand-overs,
a few hundred microseconds of a request here; a synchronous middleware, signal receiver or
`sync_to_async` added anywhere on the path shows up here as a second one."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from asgiref.testing import ApplicationCommunicator

from playground import asgi
from tests.playground.test_web_threads import (  # noqa: F401 - a fixture, used by name
    CountingThreads,
    request_started_skipped,
    whole_response,
)


def scope(method: str, path: str, key: str, body: bytes) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"testserver"),
            (b"authorization", f"Bearer {key}".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
    }


async def hops_of(
    threads: CountingThreads, method: str, path: str, key: str, payload: object = None
) -> tuple[int, int, Any]:
    """(status, crossings to a request thread, JSON body) of one request."""
    body = b"" if payload is None else json.dumps(payload).encode()
    before = threads.calls
    communicator = ApplicationCommunicator(asgi.application, scope(method, path, key, body))
    await communicator.send_input({"type": "http.request", "body": body})
    status, content = await whole_response(communicator)
    return status, threads.calls - before, json.loads(content) if content else None


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("request_started_skipped")  # as the web server runs
def test_each_api_request_crosses_to_its_thread_once(
    key_a: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads = CountingThreads(4)
    monkeypatch.setattr(asgi.django_asgi_app, "threads", threads)

    async def scenario() -> dict[str, tuple[int, int]]:
        seen: dict[str, tuple[int, int]] = {}
        status, hops, created = await hops_of(
            threads, "POST", "/api/v1/sandboxes", key_a, {"provider": "local"}
        )
        seen["create"] = (status, hops)
        path = f"/api/v1/sandboxes/{created['id']}"
        command = {"command": "true"}
        seen["command"] = (await hops_of(threads, "POST", f"{path}/commands", key_a, command))[:2]
        seen["read"] = (await hops_of(threads, "GET", path, key_a))[:2]
        seen["list"] = (await hops_of(threads, "GET", "/api/v1/sandboxes", key_a))[:2]
        seen["missing"] = (await hops_of(threads, "GET", "/api/v1/sandboxes/sbx_nope", key_a))[:2]
        seen["destroy"] = (await hops_of(threads, "DELETE", path, key_a))[:2]
        seen["health"] = (await hops_of(threads, "GET", "/health/live", key_a))[:2]
        return seen

    assert asyncio.run(scenario()) == {
        "create": (201, 1),
        "command": (200, 1),
        "read": (200, 1),
        "list": (200, 1),
        "missing": (404, 1),
        "destroy": (200, 1),
        "health": (200, 1),
    }
