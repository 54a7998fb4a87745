"""ASGI entry point: HTTP through Django, WebSockets through Channels with Origin checks."""

from __future__ import annotations

import os

from playground.webthreads import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "playground.settings")
# Django's handler, each request on a reused thread (playground/webthreads.py).
django_asgi_app = get_asgi_application()

from typing import Any  # noqa: E402
from urllib.parse import urlsplit  # noqa: E402

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import WebsocketDenier  # noqa: E402
from django.conf import settings  # noqa: E402
from django.http.request import split_domain_port, validate_host  # noqa: E402
from django.utils.http import is_same_domain  # noqa: E402

from e2bcompat.asgi import E2BRouter  # noqa: E402
from playground.admission import CreateAdmission  # noqa: E402
from sandboxes.preview.addresses import COOKIE_NAME as PREVIEW_COOKIE_NAME  # noqa: E402
from sandboxes.preview.addresses import (  # noqa: E402
    HOST_TARGET,
    preview_host_target,
    scope_host,
)
from sandboxes.preview.websocket_proxy import PreviewWebSocketProxy  # noqa: E402
from sandboxes.routing import http_app, websocket_urlpatterns  # noqa: E402

Origin = tuple[str, str, int]
"""(scheme, host, port), the port filled in from the scheme when the URL omits it."""

_DEFAULT_PORTS = {"http": 80, "https": 443}


def _parse_origin(value: str) -> Origin | None:
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None
    return scheme, parts.hostname.lower(), port or _DEFAULT_PORTS[scheme]


def _headers(scope: dict[str, Any]) -> dict[str, str]:
    found: dict[str, str] = {}
    for name, value in scope.get("headers") or ():
        found.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
    return found


def server_origins(scope: dict[str, Any]) -> list[Origin]:
    """The origin a socket was addressed to, as Django's request.is_secure() and
    get_host() would see it: the Host header (X-Forwarded-Host with USE_X_FORWARDED_HOST),
    the scope's scheme (SECURE_PROXY_SSL_HEADER when set and present). A host outside
    ALLOWED_HOSTS gives none. Without a Host header, the scope's server address; with
    neither (in-process test harnesses: servers always give one), each of ALLOWED_HOSTS on
    the scheme's default port."""
    headers = _headers(scope)
    secure = scope.get("scheme") in ("wss", "https")
    proxy = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy:
        name, expected = proxy
        forwarded = headers.get(name.removeprefix("HTTP_").lower().replace("_", "-"))
        if forwarded is not None:
            secure = forwarded.split(",", 1)[0].strip() == expected
    scheme = "https" if secure else "http"
    host = None
    if getattr(settings, "USE_X_FORWARDED_HOST", False) and headers.get("x-forwarded-host"):
        host = headers["x-forwarded-host"].split(",", 1)[0].strip()
    elif headers.get("host"):
        host = headers["host"]
    elif scope.get("server"):
        server_host, server_port = scope["server"][0], scope["server"][1]
        if getattr(settings, "USE_X_FORWARDED_PORT", False) and headers.get("x-forwarded-port"):
            server_port = headers["x-forwarded-port"]
        host = f"{server_host}:{server_port}"
    if host is None:
        candidates = [f"{scheme}://{h}" for h in settings.ALLOWED_HOSTS if "*" not in h]
        candidates = [c for c in candidates if not c.split("://", 1)[1].startswith(".")]
        return [o for o in map(_parse_origin, candidates) if o is not None]
    domain, _ = split_domain_port(host)
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return []
    own = _parse_origin(f"{scheme}://{host}")
    return [own] if own is not None else []


def origin_allowed(scope: dict[str, Any], origin: str) -> bool:
    """Whether a browser page of `origin` may open this socket: scheme, host and port equal
    to the server's own origin or to one of CSRF_TRUSTED_ORIGINS (`https://*.example.com`
    matches the subdomains, on that scheme and port), as Django's CSRF origin check."""
    parsed = _parse_origin(origin)
    if parsed is None:  # "null" (sandboxed frames, file: pages) and anything malformed
        return False
    if parsed in server_origins(scope):
        return True
    netloc = urlsplit(origin.strip()).netloc.lower()
    for trusted in settings.CSRF_TRUSTED_ORIGINS:
        pattern = urlsplit(trusted.strip())
        if pattern.netloc.startswith("*"):
            if pattern.scheme.lower() == parsed[0] and is_same_domain(
                netloc, pattern.netloc[1:].lower()
            ):
                return True
        elif _parse_origin(trusted) == parsed:
            return True
    return False


def _without_own_cookies(scope: dict[str, Any]) -> dict[str, Any]:
    """The scope minus Sandpit's cookies (session, CSRF, preview token); other cookies
    (a previewed app's own) still reach the sandbox."""
    own = {settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME, PREVIEW_COOKIE_NAME}
    headers = []
    for name, value in scope.get("headers") or ():
        if name.lower() == b"cookie":
            kept = [
                part.strip()
                for part in value.decode("latin-1").split(";")
                if part.strip() and part.strip().partition("=")[0].strip() not in own
            ]
            if not kept:
                continue
            value = "; ".join(kept).encode("latin-1")
        headers.append((name, value))
    return {**scope, "headers": headers}


class BrowserOriginValidator:
    """Refuse WebSockets opened by pages of other origins (403 at the handshake), so a
    foreign page - another site, or another port or scheme of this host - cannot drive a
    terminal with the user's cookies.

    Browsers always send Origin on a WebSocket handshake. Programs (API keys, sandbox
    tokens) may omit it: the socket goes on without Sandpit's cookies, so it must present
    its credential itself (Authorization header or ?token=), which a foreign page cannot."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        origin = _headers(scope).get("origin")
        if origin is None:
            await self.application(_without_own_cookies(scope), receive, send)
        elif origin_allowed(scope, origin):
            await self.application(scope, receive, send)
        else:
            # Channels types a scope as its own TypedDict; ASGI hands us a plain dict.
            await WebsocketDenier()(scope, receive, send)  # type: ignore[arg-type]


def origin_checked(app: Any) -> Any:
    return BrowserOriginValidator(app)


class PreviewHostSockets:
    """WebSockets addressed to a preview host (`<port>-<id>.<preview domain>`) go to the
    preview proxy, whatever their path; the rest to `app`. A browser's Origin must be the
    preview host's own origin: not Sandpit's, not CSRF_TRUSTED_ORIGINS (a wildcard there may
    cover the preview domain), and not a sibling preview, which is same-site and so would
    send this host's SameSite=Lax preview cookie."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.preview = PreviewWebSocketProxy()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        target = preview_host_target(scope_host(scope))
        if target is None:
            await self.app(scope, receive, send)
            return
        origin = _headers(scope).get("origin")
        if not isinstance(target, tuple) or (
            origin is not None and _parse_origin(origin) not in server_origins(scope)
        ):
            # Channels types a scope as its own TypedDict; ASGI hands us a plain dict.
            await WebsocketDenier()(scope, receive, send)  # type: ignore[arg-type]
            return
        await self.preview({**scope, HOST_TARGET: target}, receive, send)


application = ProtocolTypeRouter(
    {
        "http": E2BRouter(
            CreateAdmission(http_app(django_asgi_app), settings.SANDPIT_WEB_CONCURRENT_CREATES)
        ),
        "websocket": PreviewHostSockets(
            origin_checked(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))
        ),
    }
)
