"""Port previews: a server inside a sandbox, proxied on its own host or under a path.

Two forms. The host form, `<port>-<sandbox id>.<SANDPIT_PREVIEW_DOMAIN>` (and the same under
SANDPIT_E2B_DOMAIN, which is E2B's `get_host(port)`), gives each preview its own origin: a
page's absolute URLs (`<script src="/app.js">`) stay in the preview, and the browser keeps its
cookies and storage apart from Sandpit's. The path form, /sandboxes/<id>/ports/<port>/... on
Sandpit's own origin (SANDPIT_PREVIEW_PATHS), is kept for deployments without a wildcard
domain. What follows describes the path form; the host form differs where noted under "Host
form" below.

HTTP and WebSocket are relayed over provider.connect_port (works without sandbox network),
bodies streamed both ways. The prefix is stripped before forwarding (the app sees "/..."),
Location and Set-Cookie paths are rewritten back under it, hop-by-hop headers and Sandpit's
own credentials are never forwarded.

Auth, in order: ?token=<sandbox token with the 'ports' scope> (then remembered in an
HttpOnly SameSite=Lax cookie scoped to this preview's path), `Authorization: Bearer` API
key or token, that cookie, or the browser session of an organization member (checked on
every request, so logging out or leaving the organization ends access at once). A request
authenticated by a cookie (the preview cookie or the session) with an unsafe method must
come from Sandpit's own origin (Sec-Fetch-Site, else Origin): another site, or another
origin on the same site, cannot make the viewer's browser act on a preview.

Feature 'ports' (Premium); one execution per request and per WebSocket. The one exemption:
subresources (scripts, styles, images...) loaded same-origin by a member's browser session,
as told by Sec-Fetch-Dest/Sec-Fetch-Site, which only the browser sets. Requests with an API
key or token always count, whatever headers they carry.

Previews are served from Sandpit's own origin, so by default every proxied response carries
`Content-Security-Policy: sandbox ...` without allow-same-origin: the sandbox's pages run in
an opaque origin and cannot call Sandpit's API with the viewer's session. Deployments that
serve previews from a separate origin can turn that off (SANDPIT_PREVIEW_CSP_SANDBOX=False).
Headers whose effect reaches beyond the one response (ORIGIN_WIDE_HEADERS, and upstream
cookies named like Sandpit's own) are dropped, and every response is `Cache-Control: private`.

Host form: the preview host never receives Sandpit's session cookie (host-only on Sandpit's
own host), and the browser session is not accepted there even if a shared cookie domain sent
it. The first visit carries `?token=` (a sandbox token with the 'ports' scope): a GET or HEAD
with it is answered by a redirect to the same URL without the token, setting the preview
cookie host-only (no Domain), Path=/, HttpOnly, SameSite=Lax; later requests authenticate by
that cookie (or an Authorization header), re-checked on every request. No prefix is added to
Location or Set-Cookie; an upstream cookie's Domain is still dropped (host-only), so one
preview cannot set cookies for its sibling previews. No CSP sandbox: the page is already
cross-origin to Sandpit (it cannot read Sandpit's cookies, storage or API responses), and an
opaque origin would break the very things the host form is for (its own cookies, storage and
same-origin module scripts). Unsafe methods by cookie must come from the preview's own origin;
a WebSocket's Origin must be the preview's own origin (playground/asgi.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import socket
from collections.abc import Awaitable, Callable
from typing import Any, cast
from urllib.parse import parse_qsl, urlencode, urlsplit

from asgiref.sync import sync_to_async
from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from django.conf import settings
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, WebSocketException

from common.errors import PaymentRequired

from .caller import Caller
from .models import Sandbox
from .realtime.auth import WS_PAYMENT_REQUIRED, RealtimeDenied, realtime_authorize
from .streaming import (
    InvalidRequest,
    PortStream,
    ProviderError,
    sandbox_port_open,
    sandbox_port_websocket_opened,
)
from .terminals import terminal_manager

logger = logging.getLogger(__name__)

PREVIEW_PATH = re.compile(
    r"^/sandboxes/(?P<sandbox_id>[A-Za-z0-9_-]{1,40})/ports/(?P<port>[0-9]{1,5})(?P<rest>/.*)?$"
)
PREVIEW_HOST = re.compile(
    r"^(?P<port>[0-9]{1,5})-(?P<sandbox_id>[A-Za-z0-9_-]{1,40})\.(?P<domain>.+)$"
)
SANDBOX_LABEL = re.compile(r"^sbx_[0-9a-f]+$")
HOST_TARGET = "sandpit.preview_target"
AsgiApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]
"""Scope key: (sandbox id, port) of a request addressed to a preview host."""
COOKIE_NAME = "sandpit_preview"
PREVIEW_TOKEN_TTL_S = 3600
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
CSP_SANDBOX = (
    "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads "
    "allow-pointer-lock allow-presentation"
)
SUBRESOURCE_DESTS = frozenset(
    {"script", "style", "image", "font", "audio", "video", "track", "manifest", "worker"}
)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
ORIGIN_WIDE_HEADERS = frozenset(
    {
        # Act on the whole origin (Sandpit's), not on the one response: clearing the viewer's
        # cookies and storage, pinning HSTS or an alternative service for the host, widening
        # service worker scope, the FedCM login status, origin-keyed agent clusters, network
        # error logging and reporting endpoints, client hints remembered for the origin.
        "clear-site-data",
        "strict-transport-security",
        "alt-svc",
        "service-worker-allowed",
        "set-login",
        "origin-agent-cluster",
        "nel",
        "report-to",
        "accept-ch",
        "critical-ch",
        "expect-ct",
        "public-key-pins",
        "public-key-pins-report-only",
        # Caching directives aimed at shared caches (RFC 9213 and vendors' forms): a CDN in
        # front of Sandpit would otherwise keep an authenticated preview for everyone.
        "surrogate-control",
        "cdn-cache-control",
        "expires",
    }
)
READ_BYTES = 65536
HEAD_LIMIT_BYTES = 64 * 1024


def csp_sandbox_enabled() -> bool:
    return bool(getattr(settings, "SANDPIT_PREVIEW_CSP_SANDBOX", True))


def preview_paths_enabled() -> bool:
    return bool(getattr(settings, "SANDPIT_PREVIEW_PATHS", True))


def _domain_name(domain: str) -> str:
    return domain.lower().rsplit(":", 1)[0]


def preview_domains() -> tuple[str, ...]:
    """Host names (no port) under which previews answer: Sandpit's and the E2B layer's."""
    configured = (
        getattr(settings, "SANDPIT_PREVIEW_DOMAIN", ""),
        getattr(settings, "SANDPIT_E2B_DOMAIN", ""),
    )
    return tuple(_domain_name(d) for d in configured if d)


def host_label(sandbox_id: str) -> str:
    """The sandbox id as it appears in a preview host name: `sbx-<hex>` for `sbx_<hex>`.
    Host names may not hold an underscore (RFC 1123): Django's host validation, certificate
    checks and some resolvers refuse one. The E2B SDK's own `get_host` keeps the id as it
    is, so both spellings are understood."""
    return sandbox_id.replace("_", "-", 1) if SANDBOX_LABEL.match(sandbox_id) else sandbox_id


def _sandbox_id_of_label(label: str) -> str:
    if re.fullmatch(r"sbx-[0-9a-f]+", label):
        return "sbx_" + label[4:]
    return label


def preview_host_target(host: str) -> tuple[str, int] | None | bool:
    """For a Host header: (sandbox id, port) of a `<port>-<id>.<domain>` preview host; False
    for any other name under a preview domain (answered 404, never by Sandpit's pages); None
    for a host that is not a preview's."""
    name = host.lower() if host.endswith("]") else host.lower().rsplit(":", 1)[0]
    for domain in preview_domains():
        if not name.endswith("." + domain):
            continue
        match = PREVIEW_HOST.match(name)
        if match is None or match["domain"] != domain:
            return False
        return _sandbox_id_of_label(match["sandbox_id"]), int(match["port"])
    return None


def preview_url(sandbox_id: str, port: int) -> str:
    """Where a viewer opens a port: its own host when a preview domain is configured, else
    the path on Sandpit's origin."""
    domain = getattr(settings, "SANDPIT_PREVIEW_DOMAIN", "")
    if domain:
        scheme = getattr(settings, "SANDPIT_PREVIEW_SCHEME", "http")
        return f"{scheme}://{port}-{host_label(sandbox_id)}.{domain}/"
    return f"/sandboxes/{sandbox_id}/ports/{port}/"


def _headers(scope: dict[str, Any]) -> list[tuple[str, str]]:
    return [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope["headers"]]


def _cookies(scope: dict[str, Any]) -> dict[str, str]:
    cookies = scope.get("cookies")
    if isinstance(cookies, dict):
        return cookies
    found: dict[str, str] = {}
    for name, value in _headers(scope):
        if name == "cookie":
            for part in value.split(";"):
                key, _, val = part.strip().partition("=")
                found.setdefault(key, val)
    return found


def _connection_listed(headers: list[tuple[str, str]]) -> set[str]:
    listed: set[str] = set()
    for name, value in headers:
        if name == "connection":
            listed.update(token.strip().lower() for token in value.split(","))
    return listed


def _forward_cookie(value: str) -> str:
    """The Cookie header minus Sandpit's own cookies (session, CSRF, preview token)."""
    private = {settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME, COOKIE_NAME}
    kept = [
        part.strip()
        for part in value.split(";")
        if part.strip() and part.strip().partition("=")[0] not in private
    ]
    return "; ".join(kept)


def _own_cookie_names() -> frozenset[str]:
    return frozenset(
        {
            COOKIE_NAME,
            settings.SESSION_COOKIE_NAME,
            settings.CSRF_COOKIE_NAME,
            settings.LANGUAGE_COOKIE_NAME,
        }
    )


def _origin_wide(name: str) -> bool:
    return name in ORIGIN_WIDE_HEADERS or name.endswith("-cdn-cache-control")


def _cache_control(upstream: str | None) -> str:
    """Private always; `no-cache` (revalidate with Sandpit, which re-checks the viewer's
    credentials) unless the sandbox asked for no-store."""
    directives = {d.strip().split("=", 1)[0].lower() for d in (upstream or "").split(",")}
    return "private, no-store" if "no-store" in directives else "private, no-cache"


def _rewrite_set_cookie(value: str, prefix: str) -> str | None:
    """Pin the sandbox's cookies under its preview path so it can never set cookies for
    the rest of Sandpit (a 'sessionid' for '/', say); None (drop it) for a cookie named
    like one of Sandpit's own, which would shadow or replace the viewer's under the prefix.
    On a preview host (prefix ""), the path stays the app's, and the Domain goes: a cookie
    for the parent domain would reach every other preview."""
    if value.split(";", 1)[0].partition("=")[0].strip() in _own_cookie_names():
        return None
    parts = [p for p in value.split(";") if p.strip()]
    dropped = ("path", "domain") if prefix else ("domain",)
    kept = [parts[0].strip()] + [
        p.strip() for p in parts[1:] if p.strip().partition("=")[0].strip().lower() not in dropped
    ]
    if prefix:
        kept.append(f"Path={prefix}/")
    return "; ".join(kept)


def _rewrite_location(value: str, prefix: str, port: int) -> str:
    for origin in (
        f"http://localhost:{port}",
        f"http://127.0.0.1:{port}",
        f"http://0.0.0.0:{port}",
    ):
        if value.startswith(origin):
            value = value[len(origin) :] or "/"
            break
    if prefix and value.startswith("/") and not value.startswith("//"):
        return prefix + value
    return value


async def _send_json(send: Any, status: int, code: str, message: str, **headers: str) -> None:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    raw_headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    raw_headers += [(k.encode(), v.encode()) for k, v in headers.items()]
    raw_headers.append((b"cache-control", b"no-store"))
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})


def _preview_cookie(scope: dict[str, Any], token: str, prefix: str) -> str:
    """Lax: another site's page cannot send it (a cross-site form POST, an image). Pages
    of a preview run in an opaque origin (CSP sandbox), so their own subresources are
    cross-site to the browser and carry no cookie of Sandpit's, SameSite=None included
    (third-party cookies): those need ?token= in their URLs either way."""
    secure = "; Secure" if scope.get("scheme") in ("https", "wss") else ""
    return (
        f"{COOKIE_NAME}={token}; Path={prefix}/; Max-Age={PREVIEW_TOKEN_TTL_S}; "
        f"HttpOnly; SameSite=Lax{secure}"
    )


def _cross_site_unsafe(scope: dict[str, Any], header_map: dict[str, str]) -> bool:
    """An unsafe method sent by a page of another origin. Sec-Fetch-Site when the browser
    sends it (every current one does), else Origin against the Host we were asked for; a
    client sending neither is not a browser carrying someone else's cookies."""
    if scope["method"] in SAFE_METHODS:
        return False
    site = header_map.get("sec-fetch-site")
    if site is not None:
        return site not in ("same-origin", "none")
    origin = header_map.get("origin")
    if origin is None:
        return False
    return origin == "null" or urlsplit(origin).netloc != header_map.get("host", "")


def _exempt_subresource(caller: Caller, header_map: dict[str, str], *, by_cookie: bool) -> bool:
    """A same-origin subresource of a member's browser: their session (path form), or on a
    preview host the preview cookie holding a token a member minted (what the playground does;
    replaying it from a program saves no more than replaying the session). Sec-Fetch-* are
    forbidden header names, so page scripts cannot set them; a program can, so API keys and
    tokens they minted, and credentials sent in the URL or a header, never get this."""
    principal = caller.principal
    if principal is None:
        return False
    session = principal.user is not None and principal.token is None and principal.api_key is None
    members_cookie = (
        by_cookie and principal.token is not None and principal.token.minted_by.kind == "user"
    )
    return (
        (session or members_cookie)
        and header_map.get("sec-fetch-dest") in SUBRESOURCE_DESTS
        and header_map.get("sec-fetch-site") == "same-origin"
    )


class _Upstream:
    """A provider PortStream as asyncio streams (on a duplicate of its descriptor)."""

    def __init__(self, stream: PortStream) -> None:
        self.stream = stream
        self.sock = socket.socket(fileno=os.dup(stream.fileno()))
        self.sock.setblocking(False)

    def host(self, port: int) -> str:
        """The Host header the upstream expects: a cloud edge routes by it (e2b's
        get_host); a port inside a local or docker sandbox answers to localhost."""
        return getattr(self.stream, "host_header", None) or f"localhost:{port}"

    async def close(self) -> None:
        try:
            self.sock.close()
        finally:
            await sync_to_async(self.stream.close, thread_sensitive=False)()


async def _authorize(scope: dict[str, Any], sandbox_id: str) -> tuple[Caller, Sandbox]:
    return await database_sync_to_async(realtime_authorize)(
        scope,
        sandbox_id=sandbox_id,
        required_scope="ports",
        feature="ports",
        cookie_token=_cookies(scope).get(COOKIE_NAME),
    )


async def _open_port(
    caller: Caller, sandbox: Sandbox, port: int, operation: str | None
) -> _Upstream:
    stream = await sandbox_port_open(caller=caller, sandbox=sandbox, port=port, operation=operation)
    return _Upstream(stream)


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
            await _send_json(send, 404, "not_found", "No such port.")
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
            caller, sandbox = await _authorize(scope, sandbox_id)
        except RealtimeDenied as denied:
            await _send_json(send, denied.http_status, denied.code, denied.message)
            return
        headers = _headers(scope)
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
                        (b"set-cookie", _preview_cookie(scope, query_token, "").encode()),
                        (b"cache-control", b"no-store"),
                        (b"referrer-policy", b"no-referrer"),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": b""})
            return
        if query_token:
            set_cookie = _preview_cookie(scope, query_token, prefix)
        elif "authorization" not in header_map and _cross_site_unsafe(scope, header_map):
            await _send_json(
                send,
                403,
                "cross_site_request",
                "A preview authenticated by cookie accepts unsafe methods only from its own "
                "origin; send ?token= or an Authorization header.",
            )
            return
        # Counted once connected, before the answer leaves; one exemption (_exempt_subresource).
        by_cookie = not prefix and not query_token and "authorization" not in header_map
        exempt = _exempt_subresource(caller, header_map, by_cookie=by_cookie)
        operation = None if exempt else "ports.request"
        try:
            upstream = await _open_port(caller, sandbox, port, operation)
        except InvalidRequest as exc:
            await _send_json(send, 502, "port_not_listening", exc.message)
            return
        except ProviderError as exc:
            await _send_json(send, 502, exc.code, exc.message)
            return
        except PaymentRequired as exc:  # the plan changed since this request was admitted
            await _send_json(send, exc.status_code, exc.code, exc.message)
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
        upstream: _Upstream,
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
        listed = _connection_listed(headers)
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
                value = _forward_cookie(value)
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
            await _send_json(
                send, 502, "bad_gateway", "The server in the sandbox sent no valid HTTP response."
            )
            return
        response_headers = []
        for line in lines[1:]:
            if ":" in line:
                name, _, value = line.partition(":")
                response_headers.append((name.strip().lower(), value.strip()))
        listed = _connection_listed(response_headers)
        # Only the path form shares Sandpit's origin (module docstring, "Host form").
        sandboxed = bool(prefix) and csp_sandbox_enabled()
        chunked = any(
            n == "transfer-encoding" and "chunked" in v.lower() for n, v in response_headers
        )
        length = next((v for n, v in response_headers if n == "content-length"), None)
        out: list[tuple[bytes, bytes]] = []
        for name, value in response_headers:
            if name in HOP_BY_HOP or name in listed or _origin_wide(name):
                continue
            if name == "content-length" and chunked:
                continue
            if name == "cache-control":
                continue
            if name == "location":
                value = _rewrite_location(value, prefix, port)
            elif name == "set-cookie":
                rewritten = _rewrite_set_cookie(value, prefix)
                if rewritten is None:
                    continue
                value = rewritten
            elif name == "content-security-policy" and sandboxed:
                continue
            out.append((name.encode("latin-1"), value.encode("latin-1")))
        upstream_cache = next((v for n, v in response_headers if n == "cache-control"), None)
        out.append((b"cache-control", _cache_control(upstream_cache).encode()))
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


class PreviewWebSocketProxy:
    """ASGI app for websocket scopes under /sandboxes/<id>/ports/<port>/ (behind the Origin
    validator and the session middleware of playground/asgi.py), or on a preview host
    (HOST_TARGET in the scope; no session there, and the Origin must be the host's own)."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        target = scope.get(HOST_TARGET)
        if target is not None:
            sandbox_id, port = target
            rest = scope["path"] or "/"
            scope = {k: v for k, v in scope.items() if k not in ("user", "session")}
        else:
            match = PREVIEW_PATH.match(scope["path"])
            if match is None or not preview_paths_enabled():
                await send({"type": "websocket.close", "code": 4404})
                return
            sandbox_id, port = match["sandbox_id"], int(match["port"])
            rest = match["rest"] or "/"
        message = await receive()
        if message["type"] != "websocket.connect":
            return
        try:
            caller, sandbox = await _authorize(scope, sandbox_id)
            upstream = await _open_port(caller, sandbox, port, None)
        except RealtimeDenied as denied:
            await send({"type": "websocket.accept"})
            await send({"type": "websocket.close", "code": denied.close_code})
            return
        except ProviderError:
            await send({"type": "websocket.close", "code": 1011})
            return
        except PaymentRequired:  # the plan changed since this socket was admitted
            await send({"type": "websocket.accept"})
            await send({"type": "websocket.close", "code": WS_PAYMENT_REQUIRED})
            return
        query = [
            (k, v)
            for k, v in parse_qsl(
                scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True
            )
            if k != "token"
        ]
        uri = f"ws://localhost:{port}{rest}" + ("?" + urlencode(query) if query else "")
        try:
            async with connect(
                uri,
                sock=upstream.sock,
                subprotocols=scope.get("subprotocols") or None,
                open_timeout=10,
                max_size=None,
                compression=None,
            ) as ws:
                await send({"type": "websocket.accept", "subprotocol": ws.subprotocol})
                asyncio.ensure_future(
                    database_sync_to_async(sandbox_port_websocket_opened)(caller=caller)
                )

                async def downstream() -> None:
                    async for data in ws:
                        if isinstance(data, bytes):
                            await send({"type": "websocket.send", "bytes": data})
                        else:
                            await send({"type": "websocket.send", "text": data})

                pump = asyncio.ensure_future(downstream())
                try:
                    while True:
                        get = asyncio.ensure_future(receive())
                        done, _ = await asyncio.wait(
                            {get, pump}, return_when=asyncio.FIRST_COMPLETED
                        )
                        if pump in done:
                            get.cancel()
                            await send({"type": "websocket.close", "code": ws.close_code or 1000})
                            return
                        incoming = get.result()
                        if incoming["type"] == "websocket.disconnect":
                            return
                        if incoming.get("bytes") is not None:
                            await ws.send(incoming["bytes"])
                        elif incoming.get("text") is not None:
                            await ws.send(incoming["text"])
                finally:
                    pump.cancel()
        except (OSError, WebSocketException, ConnectionClosed, TimeoutError):
            logger.info("preview websocket ended", exc_info=True)
            with contextlib.suppress(Exception):  # the client may be gone already
                await send({"type": "websocket.close", "code": 1011})
        finally:
            await upstream.close()


class PreviewRouter:
    """The HTTP side of the ASGI app: previews here, everything else to Django. Also tells
    the terminal manager which loop serves requests (REST-created terminals read on it)."""

    def __init__(self, django_app: Any) -> None:
        self.django_app = django_app
        # Channels types its middleware for its own scope TypedDicts; it is an ASGI app.
        self.proxy = cast(AsgiApp, AuthMiddlewareStack(PreviewHttpProxy()))
        self.host_proxy = PreviewHttpProxy()  # no session middleware: not accepted there

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        loop = asyncio.get_running_loop()
        if terminal_manager.loop is not loop:
            terminal_manager.bind_loop(loop)
        if scope["type"] == "http":
            target = preview_host_target(scope_host(scope))
            if target is False:
                await _send_json(send, 404, "not_found", "No such preview host.")
                return
            if isinstance(target, tuple):
                await self.host_proxy({**scope, HOST_TARGET: target}, receive, send)
                return
            if preview_paths_enabled() and PREVIEW_PATH.match(scope["path"]):
                await self.proxy(scope, receive, send)
                return
        await self.django_app(scope, receive, send)


def scope_host(scope: dict[str, Any]) -> str:
    """The Host header of an ASGI scope ("" without one)."""
    for name, value in scope.get("headers") or ():
        if name.lower() == b"host":
            return str(value.decode("latin-1"))
    return ""
