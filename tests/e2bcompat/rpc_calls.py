"""Connect RPC calls (JSON) to the E2B layer's envd services, in process, through the E2B
router, for the tests that count or refuse them."""

from __future__ import annotations

import json
from typing import Any

import httpx
from asgiref.sync import async_to_sync

from e2bcompat.asgi import E2BRouter


def list_dir(headers: dict[str, str]) -> httpx.Response:
    """One filesystem.Filesystem/ListDir of /home/user with the caller's `headers` (its
    credential and E2b-Sandbox-Id)."""

    async def not_rpc(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError(f"not routed to the RPC services: {scope['path']}")

    async def post() -> httpx.Response:
        transport = httpx.ASGITransport(app=E2BRouter(not_rpc))
        async with httpx.AsyncClient(transport=transport, base_url="http://sandpit") as client:
            return await client.post(
                "/e2b/filesystem.Filesystem/ListDir",
                content=json.dumps({"path": "/home/user", "depth": 1}),
                headers={
                    "Content-Type": "application/json",
                    "Connect-Protocol-Version": "1",
                    **headers,
                },
            )

    return async_to_sync(post)()
