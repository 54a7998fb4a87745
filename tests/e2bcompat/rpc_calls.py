"""Connect RPC calls (JSON) to the E2B layer's envd services, in process, through the E2B
router, for the tests that count or refuse them."""

from __future__ import annotations

import json
import struct
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


def envelope(message: Any) -> bytes:
    """One Connect envelope (flags 0) of `message` as JSON, or of `message` as it is if bytes."""
    payload = message if isinstance(message, bytes) else json.dumps(message).encode()
    return struct.pack(">BI", 0, len(payload)) + payload


def envelopes(body: bytes) -> list[tuple[int, Any]]:
    """(flags, JSON) of each envelope of a streamed answer; AssertionError if the framing is
    broken."""
    found, at = [], 0
    while at < len(body):
        assert len(body) - at >= 5, f"a truncated envelope header at {at}: {body[at:]!r}"
        flags, size = struct.unpack(">BI", body[at : at + 5])
        payload = body[at + 5 : at + 5 + size]
        assert len(payload) == size, f"an envelope of {size} bytes holds {len(payload)}"
        found.append((flags, json.loads(payload)))
        at += 5 + size
    return found


def rpc(path: str, body: bytes, headers: dict[str, str], *, stream: bool = False) -> httpx.Response:
    """One Connect RPC of `body` (a unary call's JSON bytes, or a stream's envelopes) to
    `path` (as /process.Process/List) through the E2B router, in process."""

    async def not_rpc(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError(f"not routed to the RPC services: {scope['path']}")

    content_type = "application/connect+json" if stream else "application/json"

    async def post() -> httpx.Response:
        transport = httpx.ASGITransport(app=E2BRouter(not_rpc))
        async with httpx.AsyncClient(transport=transport, base_url="http://sandpit") as client:
            return await client.post(
                "/e2b" + path,
                content=body,
                headers={
                    "Content-Type": content_type,
                    "Connect-Protocol-Version": "1",
                    **headers,
                },
            )

    return async_to_sync(post)()
