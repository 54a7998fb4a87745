"""Who may use a preview and what one use costs: the preview cookie, the cross-site check,
the subresource exemption, authorizing a request (realtime_authorize, the 'ports' scope and
feature) and opening the port through the streaming service, which meters it."""

from __future__ import annotations

import os
import socket
from typing import Any
from urllib.parse import urlsplit

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async

from sandboxes.caller import Caller
from sandboxes.models import Sandbox
from sandboxes.realtime.auth import realtime_authorize
from sandboxes.streaming import PortStream, sandbox_port_open

from .addresses import COOKIE_NAME
from .headers import scope_cookies

PREVIEW_TOKEN_TTL_S = 3600
SUBRESOURCE_DESTS = frozenset(
    {"script", "style", "image", "font", "audio", "video", "track", "manifest", "worker"}
)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def preview_cookie(scope: dict[str, Any], token: str, prefix: str) -> str:
    """Lax: another site's page cannot send it (a cross-site form POST, an image). Pages
    of a preview run in an opaque origin (CSP sandbox), so their own subresources are
    cross-site to the browser and carry no cookie of Sandpit's, SameSite=None included
    (third-party cookies): those need ?token= in their URLs either way."""
    secure = "; Secure" if scope.get("scheme") in ("https", "wss") else ""
    return (
        f"{COOKIE_NAME}={token}; Path={prefix}/; Max-Age={PREVIEW_TOKEN_TTL_S}; "
        f"HttpOnly; SameSite=Lax{secure}"
    )


def cross_site_unsafe(scope: dict[str, Any], header_map: dict[str, str]) -> bool:
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


def exempt_subresource(caller: Caller, header_map: dict[str, str], *, by_cookie: bool) -> bool:
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


class Upstream:
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


async def authorize(scope: dict[str, Any], sandbox_id: str) -> tuple[Caller, Sandbox]:
    return await database_sync_to_async(realtime_authorize)(
        scope,
        sandbox_id=sandbox_id,
        required_scope="ports",
        feature="ports",
        cookie_token=scope_cookies(scope).get(COOKIE_NAME),
    )


async def open_port(caller: Caller, sandbox: Sandbox, port: int, operation: str | None) -> Upstream:
    stream = await sandbox_port_open(caller=caller, sandbox=sandbox, port=port, operation=operation)
    return Upstream(stream)
