"""How a request names a preview: its host (`<port>-<sandbox id>.<domain>`), its path
(/sandboxes/<id>/ports/<port>/...), the cookie that carries its token; and the URL a viewer
opens for a port. Settings only: the events socket (watchers) builds URLs from here without
importing the proxy."""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings

PREVIEW_PATH = re.compile(
    r"^/sandboxes/(?P<sandbox_id>[A-Za-z0-9_-]{1,40})/ports/(?P<port>[0-9]{1,5})(?P<rest>/.*)?$"
)
PREVIEW_HOST = re.compile(
    r"^(?P<port>[0-9]{1,5})-(?P<sandbox_id>[A-Za-z0-9_-]{1,40})\.(?P<domain>.+)$"
)
SANDBOX_LABEL = re.compile(r"^sbx_[0-9a-f]+$")
HOST_TARGET = "sandpit.preview_target"
"""Scope key: (sandbox id, port) of a request addressed to a preview host."""
COOKIE_NAME = "sandpit_preview"


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


def scope_host(scope: dict[str, Any]) -> str:
    """The Host header of an ASGI scope ("" without one)."""
    for name, value in scope.get("headers") or ():
        if name.lower() == b"host":
            return str(value.decode("latin-1"))
    return ""
