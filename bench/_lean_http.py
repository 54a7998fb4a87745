"""A lean HTTP/1.1 client for load on the benchmarked server's own machine.

A burst's client shares the 2 cores with the server it measures: httpx spends about a
millisecond of CPU per request (bench_burst prints the client's CPU per sandbox), which
the server's requests then wait for. This one writes the request and reads the answer on
an asyncio stream, one keep-alive connection per concurrent caller, as a load generator on
another machine would cost the server nothing. Not a general client: JSON bodies,
Content-Length responses, no redirects, no TLS.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any


class LeanResponse:
    def __init__(self, status_code: int, body: bytes) -> None:
        self.status_code = status_code
        self.content = body

    @property
    def text(self) -> str:
        return self.content.decode(errors="replace")

    def json(self) -> Any:
        return json.loads(self.content)


class LeanClient:
    """Requests to one server; each call takes an idle connection or opens one."""

    def __init__(self, port: int, headers: dict[str, str]) -> None:
        self.port = port
        self.head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def request(self, method: str, path: str, body: Any = None) -> LeanResponse:
        payload = b"" if body is None else json.dumps(body).encode()
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n{self.head}"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        )
        reader, writer = (
            self.idle.pop()
            if self.idle
            else await asyncio.open_connection("127.0.0.1", self.port, limit=1 << 22)
        )
        writer.write(head.encode() + payload)
        status_line = await reader.readline()
        length = 0
        keep = True
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "connection" and value.strip().lower() == "close":
                keep = False
        content = await reader.readexactly(length) if length else b""
        if keep:
            self.idle.append((reader, writer))
        else:
            writer.close()
        return LeanResponse(int(status_line.split()[1]), content)

    async def post(self, path: str, json: Any = None) -> LeanResponse:  # noqa: A002 - httpx's name
        return await self.request("POST", path, json)

    async def get(self, path: str) -> LeanResponse:
        return await self.request("GET", path)

    async def delete(self, path: str) -> LeanResponse:
        return await self.request("DELETE", path)

    async def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()
