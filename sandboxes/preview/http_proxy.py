"""The HTTP side of a preview: authorize, open the port, relay the request (body streamed
in) and the response (body streamed out), rewriting headers on the way."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import parse_qsl, urlencode

from common.errors import PaymentRequired
from sandboxes.realtime.auth import RealtimeDenied
from sandboxes.streaming import InvalidRequest, ProviderError

from .access import (
    Upstream,
    authorize,
    cross_site_unsafe,
    exempt_subresource,
    open_port,
    preview_cookie,
)
from .addresses import HOST_TARGET, PREVIEW_PATH
from .headers import (
    CSP_SANDBOX,
    HOP_BY_HOP,
    cache_control,
    connection_listed,
    csp_sandbox_enabled,
    forward_cookie,
    origin_wide,
    rewrite_location,
    rewrite_set_cookie,
    scope_headers,
    send_json,
)

READ_BYTES = 65536
HEAD_LIMIT_BYTES = 64 * 1024


class PreviewHttpProxy:
    """ASGI app for http scopes of a preview: under /sandboxes/<id>/ports/<port>/, or on a
    preview host (HOST_TARGET in the scope, set by PreviewRouter)."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        target = scope.get(HOST_TARGET)
        if target is not None:
            sandbox_id, port = target
            rest: str | None = scope["path"] or "/"
            prefix = ""
            # No browser session on a preview host (see the module docstring).
            scope = {k: v for k, v in scope.items() if k not in ("user", "session")}
        else:
            match = PREVIEW_PATH.match(scope["path"])
            assert match is not None
            sandbox_id, port, rest = match["sandbox_id"], int(match["port"]), match["rest"]
            prefix = f"/sandboxes/{sandbox_id}/ports/{port}"
        if not 0 < port < 65536:
            await send_json(send, 404, "not_found", "No such port.")
            return
        query = [
            (k, v)
            for k, v in parse_qsl(
                scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True
            )
            if k != "token"
        ]
        if rest is None:
            location = (
                prefix
                + "/"
                + (
                    f"?{scope['query_string'].decode('latin-1')}"
                    if scope.get("query_string")
                    else ""
                )
            )
            await send(
                {
                    "type": "http.response.start",
                    "status": 308,
                    "headers": [(b"location", location.encode())],
                }
            )
            await send({"type": "http.response.body", "body": b""})
            return
        try:
            caller, sandbox = await authorize(scope, sandbox_id)
        except RealtimeDenied as denied:
            await send_json(send, denied.http_status, denied.code, denied.message)
            return
        headers = scope_headers(scope)
        header_map = dict(headers)
        set_cookie: str | None = None
        query_token = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1"))).get("token")
        if query_token and not prefix and scope["method"] in ("GET", "HEAD"):
            # The token leaves the address bar (and the app's logs and Referer) at once.
            clean = rest + ("?" + urlencode(query) if query else "")
            await send(
                {
                    "type": "http.response.start",
                    "status": 302,
                    "headers": [
                        (b"location", clean.encode("latin-1")),
                        (b"set-cookie", preview_cookie(scope, query_token, "").encode()),
                        (b"cache-control", b"no-store"),
                        (b"referrer-policy", b"no-referrer"),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": b""})
            return
        if query_token:
            set_cookie = preview_cookie(scope, query_token, prefix)
        elif "authorization" not in header_map and cross_site_unsafe(scope, header_map):
            await send_json(
                send,
                403,
                "cross_site_request",
                "A preview authenticated by cookie accepts unsafe methods only from its own "
                "origin; send ?token= or an Authorization header.",
            )
            return
        # Counted once connected, before the answer leaves; one exemption (exempt_subresource).
        by_cookie = not prefix and not query_token and "authorization" not in header_map
        exempt = exempt_subresource(caller, header_map, by_cookie=by_cookie)
        operation = None if exempt else "ports.request"
        try:
            upstream = await open_port(caller, sandbox, port, operation)
        except InvalidRequest as exc:
            await send_json(send, 502, "port_not_listening", exc.message)
            return
        except ProviderError as exc:
            await send_json(send, 502, exc.code, exc.message)
            return
        except PaymentRequired as exc:  # the plan changed since this request was admitted
            await send_json(send, exc.status_code, exc.code, exc.message)
            return
        try:
            await self._relay(
                scope, receive, send, upstream, rest, query, headers, prefix, port, set_cookie
            )
        finally:
            await upstream.close()

    async def _relay(
        self,
        scope: dict[str, Any],
        receive: Any,
        send: Any,
        upstream: Upstream,
        rest: str,
        query: list[tuple[str, str]],
        headers: list[tuple[str, str]],
        prefix: str,
        port: int,
        set_cookie: str | None,
    ) -> None:
        reader, writer = await asyncio.open_connection(sock=upstream.sock)
        method = scope["method"]
        target = rest + ("?" + urlencode(query) if query else "")
        listed = connection_listed(headers)
        authorization_is_ours = True  # every Bearer reaching here authenticated us
        out = [f"{method} {target} HTTP/1.1", f"Host: {upstream.host(port)}"]
        chunked_body = False
        for name, value in headers:
            if name in HOP_BY_HOP or name in listed or name == "host":
                if name == "transfer-encoding" and "chunked" in value.lower():
                    chunked_body = True
                continue
            if name == "authorization" and authorization_is_ours:
                continue
            if name == "cookie":
                value = forward_cookie(value)
                if not value:
                    continue
            if name.startswith("x-forwarded-"):
                continue
            out.append(f"{name}: {value}")
        client = scope.get("client") or ("", 0)
        out += [
            f"X-Forwarded-For: {client[0]}",
            f"X-Forwarded-Proto: {scope.get('scheme', 'http')}",
            f"X-Forwarded-Host: {dict(headers).get('host', '')}",
            "Connection: close",
        ]
        if prefix:
            out.append(f"X-Forwarded-Prefix: {prefix}")
        if chunked_body:
            out.append("Transfer-Encoding: chunked")
        writer.write(("\r\n".join(out) + "\r\n\r\n").encode("latin-1"))
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            if body:
                writer.write(b"%x\r\n%s\r\n" % (len(body), body) if chunked_body else body)
                await writer.drain()
            if not message.get("more_body"):
                break
        if chunked_body:
            writer.write(b"0\r\n\r\n")
        await writer.drain()

        relay = asyncio.ensure_future(
            self._response(reader, send, method, prefix, port, set_cookie)
        )
        disconnect = asyncio.ensure_future(_wait_disconnect(receive))
        try:
            done, _ = await asyncio.wait({relay, disconnect}, return_when=asyncio.FIRST_COMPLETED)
            if relay in done:
                relay.result()
        finally:
            relay.cancel()
            disconnect.cancel()

    async def _response(
        self,
        reader: asyncio.StreamReader,
        send: Any,
        method: str,
        prefix: str,
        port: int,
        set_cookie: str | None,
    ) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if len(head) > HEAD_LIMIT_BYTES:
                    raise ValueError("response head too large")
                lines = head.decode("latin-1").split("\r\n")
                status = int(lines[0].split(" ", 2)[1])
                if status >= 200 or status == 101:
                    break
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, IndexError):
            await send_json(
                send, 502, "bad_gateway", "The server in the sandbox sent no valid HTTP response."
            )
            return
        response_headers = []
        for line in lines[1:]:
            if ":" in line:
                name, _, value = line.partition(":")
                response_headers.append((name.strip().lower(), value.strip()))
        listed = connection_listed(response_headers)
        # Only the path form shares Sandpit's origin (module docstring, "Host form").
        sandboxed = bool(prefix) and csp_sandbox_enabled()
        chunked = any(
            n == "transfer-encoding" and "chunked" in v.lower() for n, v in response_headers
        )
        length = next((v for n, v in response_headers if n == "content-length"), None)
        out: list[tuple[bytes, bytes]] = []
        for name, value in response_headers:
            if name in HOP_BY_HOP or name in listed or origin_wide(name):
                continue
            if name == "content-length" and chunked:
                continue
            if name == "cache-control":
                continue
            if name == "location":
                value = rewrite_location(value, prefix, port)
            elif name == "set-cookie":
                rewritten = rewrite_set_cookie(value, prefix)
                if rewritten is None:
                    continue
                value = rewritten
            elif name == "content-security-policy" and sandboxed:
                continue
            out.append((name.encode("latin-1"), value.encode("latin-1")))
        upstream_cache = next((v for n, v in response_headers if n == "cache-control"), None)
        out.append((b"cache-control", cache_control(upstream_cache).encode()))
        if sandboxed:
            out.append((b"content-security-policy", CSP_SANDBOX.encode()))
        out.append((b"x-content-type-options", b"nosniff"))
        if set_cookie:
            out.append((b"set-cookie", set_cookie.encode("latin-1")))
        await send({"type": "http.response.start", "status": status, "headers": out})
        no_body = method == "HEAD" or status in (204, 304) or 100 <= status < 200
        if no_body:
            await send({"type": "http.response.body", "body": b""})
            return
        if chunked:
            while True:
                size_line = await reader.readline()
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")  # trailers are dropped
                    break
                data = await reader.readexactly(size)
                await reader.readexactly(2)
                await send({"type": "http.response.body", "body": data, "more_body": True})
        elif length is not None:
            remaining = int(length)
            while remaining > 0:
                data = await reader.read(min(READ_BYTES, remaining))
                if not data:
                    break
                remaining -= len(data)
                await send({"type": "http.response.body", "body": data, "more_body": True})
        else:
            while data := await reader.read(READ_BYTES):
                await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


async def _wait_disconnect(receive: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
