"""What the E2B SDK expects back: its version, template names, paths, error shapes.

The one place E2B's vocabulary meets Sandpit's; the views and RPC services only call these.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl

from django.conf import settings

from accounts.models import Organization
from common.errors import ApplicationError, NotFound
from sandboxes.models import Sandbox, SandboxState
from sandboxes.providers import configured_provider_names
from sandboxes.selectors import template_by_name

ENVD_VERSION = "0.5.7"
"""The envd version Sandpit answers as. 0.5.7 turns on what Sandpit serves (stdin, close
stdin, the default user, octet-stream uploads) and leaves off what it does not (file
metadata in extended attributes: 0.6.2; entries inside watch events: 0.6.3)."""
CLIENT_ID = "sandpit"
E2B_HOME = "/home/user"
"""E2B's default user's home and working directory; in a Sandpit sandbox that is
/workspace (HOME there), so paths under it are mapped onto the workspace."""
WORKSPACE = "/workspace"
BASE_TEMPLATES = frozenset({"base", "default", "code-interpreter-v1", "desktop"})
"""E2B's own template names, all served by the installation's default provider and
Sandpit's default template."""


def template_resolve(
    template_id: str, organization: Organization | None = None
) -> tuple[str | None, str]:
    """(provider name or None for the default, the Sandpit template to start from) for an E2B
    template id.

    E2B's base templates map to the default provider and environment; the name of an enabled
    provider ('local', 'docker') picks that provider; a Sandpit template the organization
    sees (GET /api/v1/templates: a built-in such as 'python', or its own) starts from that
    template on the default provider (sandbox_create then says 409 when it is not built).
    Anything else is E2B's 404 'template not found'."""
    name = (template_id or "base").split(":", 1)[0]
    if name in BASE_TEMPLATES:
        return None, "default"
    if name in configured_provider_names():
        return name, "default"
    if organization is not None and template_by_name(organization, name) is not None:
        return None, name
    raise NotFound(
        f"Template '{template_id}' was not found: Sandpit serves E2B's base templates "
        f"({', '.join(sorted(BASE_TEMPLATES))}), its providers "
        f"({', '.join(configured_provider_names())}) and the templates of GET /api/v1/templates.",
        code="template_not_found",
    )


def template_matches(wanted: str, listed: str) -> bool:
    """Whether a sandbox listed with E2B template id `listed` is one of `wanted` (a name,
    with or without a tag): E2B's base templates are all Sandpit's default one, 'base'."""
    name = wanted.split(":", 1)[0]
    return listed == ("base" if name in BASE_TEMPLATES else name)


def sandbox_path(path: str) -> str:
    """An E2B path as Sandpit's providers take it: /home/user/... onto /workspace/...,
    relative paths relative to the workspace, other absolute paths as they are."""
    if path == E2B_HOME or path.startswith(E2B_HOME + "/"):
        return WORKSPACE + path[len(E2B_HOME) :]
    return path


def e2b_path(workspace_relative: str) -> str:
    """A provider's workspace-relative path as the absolute path E2B reports."""
    rest = workspace_relative.strip("/")
    return f"{WORKSPACE}/{rest}" if rest and rest != "." else WORKSPACE


def sandbox_cwd(cwd: str | None) -> str | None:
    return sandbox_path(cwd) if cwd else None


def _end_at(sandbox: Sandbox) -> datetime:
    """When the sandbox stops if nothing happens: idle timeout after the last activity,
    capped by its lifetime."""
    idle_end = sandbox.last_activity_at + timedelta(seconds=sandbox.timeout_s)
    return min(idle_end, sandbox.expires_at)


HELD_STATES = (SandboxState.PAUSED, SandboxState.ARCHIVED)
"""What E2B calls paused: Sandpit's paused (frozen) and archived (files only) sandboxes."""


def _state(sandbox: Sandbox) -> str:
    return "running" if sandbox.state == SandboxState.RUNNING else "paused"


def sandbox_listed(sandbox: Sandbox) -> dict[str, Any]:
    """E2B's ListedSandbox."""
    resources = sandbox.resources or {}
    return {
        "templateID": sandbox.template if sandbox.template != "default" else "base",
        "sandboxID": sandbox.id,
        "clientID": CLIENT_ID,
        "startedAt": (sandbox.started_at or sandbox.created_at).isoformat(),
        "endAt": _end_at(sandbox).isoformat(),
        "cpuCount": max(1, int(float(resources.get("cpu_count", 1)))),
        "memoryMB": int(resources.get("memory_mb", 512)),
        "diskSizeMB": int(resources.get("disk_mb", 512)),
        "state": _state(sandbox),
        "envdVersion": ENVD_VERSION,
        "metadata": {str(k): str(v) for k, v in (sandbox.metadata or {}).items()},
    }


def sandbox_detail(sandbox: Sandbox, *, access_token: str | None = None) -> dict[str, Any]:
    """E2B's SandboxDetail (GET /sandboxes/{id})."""
    body = sandbox_listed(sandbox)
    body["domain"] = settings.SANDPIT_E2B_DOMAIN or None
    body["allowInternetAccess"] = bool(sandbox.network)
    if access_token is not None:
        body["envdAccessToken"] = access_token
    return body


def sandbox_created(sandbox: Sandbox, *, access_token: str) -> dict[str, Any]:
    """E2B's Sandbox (the answer to create and connect)."""
    return {
        "templateID": sandbox_listed(sandbox)["templateID"],
        "sandboxID": sandbox.id,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": access_token,
        "trafficAccessToken": None,
        "domain": settings.SANDPIT_E2B_DOMAIN or None,
    }


def require_running(sandbox: Sandbox, *, paused_too: bool = False) -> None:
    """E2B knows only live (and, where `paused_too`, paused) sandboxes: a destroyed or
    failed one is 'not found'."""
    if sandbox.state != SandboxState.RUNNING and not (paused_too and sandbox.state in HELD_STATES):
        raise NotFound(f"Sandbox {sandbox.id} was not found.", code="sandbox_not_found")


def metadata_filter(raw: str | None) -> dict[str, str]:
    """The `metadata` query of GET /v2/sandboxes: a form-encoded `k=v&k2=v2` string."""
    if not raw:
        return {}
    try:
        return dict(parse_qsl(raw, keep_blank_values=True, strict_parsing=True))
    except ValueError:
        raise ApplicationError("metadata must be form-encoded key=value pairs.") from None
