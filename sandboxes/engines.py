"""Docker engines as Sandpit sees them: the label a sandbox requires, which engine runs it,
and each engine's state (for /health/ready and /metrics).

Required labels are a setting, not a database field: SANDPIT_DOCKER_ENGINE_REQUIREMENTS maps
organizations (by slug) and templates (by name) to an engine label, e.g.
`org:acme=gpu,template:cuda=gpu`. A template's requirement wins over its organization's:
the template is what needs the hardware. What happens to an engine that stops answering is
in engine_health.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from django.conf import settings
from django.db.models import Count

from accounts.models import Organization

from .models import Sandbox, SandboxState
from .providers import configured_provider_names, get_provider
from .providers.base import ProviderError, SandboxHandle
from .providers.docker.engines import REQUIRED_LABEL, DockerEngines, EngineStatus, engines_of

ENGINE_LABEL = "sandpit.engine"
"""The label the docker provider puts on each container: the engine's name."""


def engine_requirements() -> dict[str, str]:
    """SANDPIT_DOCKER_ENGINE_REQUIREMENTS as {"org:<slug>" | "template:<name>": label}."""
    out: dict[str, str] = {}
    for item in str(settings.SANDPIT_DOCKER_ENGINE_REQUIREMENTS or "").replace(" ", ",").split(","):
        key, sep, label = item.strip().partition("=")
        if sep and key.startswith(("org:", "template:")) and label:
            out[key] = label
    return out


def engine_label_required(organization: Organization, template: str) -> str:
    """The engine label a new sandbox of `organization` from `template` must land on ('': any)."""
    requirements = engine_requirements()
    return requirements.get(f"template:{template}") or requirements.get(
        f"org:{organization.slug}", ""
    )


def engine_spec_labels(organization: Organization, template: str) -> dict[str, str]:
    """Spec labels that carry the requirement to the docker provider's placement."""
    label = engine_label_required(organization, template)
    return {REQUIRED_LABEL: label} if label else {}


def handle_engine(handle: SandboxHandle) -> str:
    """The engine a new sandbox landed on ('' for providers without engines)."""
    return str(handle.labels.get(ENGINE_LABEL) or "")


def docker_engines() -> DockerEngines | None:
    """The docker provider's engines, or None when docker is not enabled here."""
    if "docker" not in configured_provider_names():
        return None
    try:
        return engines_of(get_provider("docker"))
    except ProviderError:
        return None


@dataclass(frozen=True)
class EngineReport:
    """One engine for /health/ready and /metrics."""

    status: EngineStatus
    live_rows: int
    """Sandboxes Sandpit holds live on it (running or paused rows)."""

    def as_json(self) -> Mapping[str, object]:
        s = self.status
        return {
            "status": "ok" if s.ok else "down",
            "detail": s.detail,
            "url": s.url,
            "labels": list(s.labels),
            "latency_ms": round(s.latency_ms, 2),
            "running": s.sandboxes,
            "live_rows": self.live_rows,
            "memory_reserved_mb": s.memory_reserved_mb,
            "memory_capacity_mb": s.memory_capacity_mb,
            "max_sandboxes": s.max_sandboxes,
        }


def engine_reports() -> list[EngineReport]:
    """Every docker engine's state now (one probe each); [] without the docker provider."""
    engines = docker_engines()
    if engines is None:
        return []
    live = dict(
        Sandbox.objects.filter(
            provider="docker", state__in=(SandboxState.RUNNING, SandboxState.PAUSED)
        )
        .values_list("engine")
        .annotate(n=Count("id"))
        .values_list("engine", "n")
    )
    return [
        EngineReport(status=status, live_rows=live.get(status.name, 0))
        for status in engines.engine_statuses()
    ]
