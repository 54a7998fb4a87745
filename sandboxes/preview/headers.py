"""Headers both ways: what is forwarded to the server in the sandbox (no hop-by-hop headers,
none of Sandpit's credentials) and what comes back to the viewer (cookies pinned to the
preview, Location rewritten, nothing that acts on Sandpit's whole origin)."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings

from .addresses import COOKIE_NAME

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


def csp_sandbox_enabled() -> bool:
    return bool(getattr(settings, "SANDPIT_PREVIEW_CSP_SANDBOX", True))


def scope_headers(scope: dict[str, Any]) -> list[tuple[str, str]]:
    return [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope["headers"]]


def scope_cookies(scope: dict[str, Any]) -> dict[str, str]:
    cookies = scope.get("cookies")
    if isinstance(cookies, dict):
        return cookies
    found: dict[str, str] = {}
    for name, value in scope_headers(scope):
        if name == "cookie":
            for part in value.split(";"):
                key, _, val = part.strip().partition("=")
                found.setdefault(key, val)
    return found


def connection_listed(headers: list[tuple[str, str]]) -> set[str]:
    listed: set[str] = set()
    for name, value in headers:
        if name == "connection":
            listed.update(token.strip().lower() for token in value.split(","))
    return listed


def forward_cookie(value: str) -> str:
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


def origin_wide(name: str) -> bool:
    return name in ORIGIN_WIDE_HEADERS or name.endswith("-cdn-cache-control")


def cache_control(upstream: str | None) -> str:
    """Private always; `no-cache` (revalidate with Sandpit, which re-checks the viewer's
    credentials) unless the sandbox asked for no-store."""
    directives = {d.strip().split("=", 1)[0].lower() for d in (upstream or "").split(",")}
    return "private, no-store" if "no-store" in directives else "private, no-cache"


def rewrite_set_cookie(value: str, prefix: str) -> str | None:
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


def rewrite_location(value: str, prefix: str, port: int) -> str:
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


async def send_json(send: Any, status: int, code: str, message: str, **headers: str) -> None:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    raw_headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    raw_headers += [(k.encode(), v.encode()) for k, v in headers.items()]
    raw_headers.append((b"cache-control", b"no-store"))
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})
