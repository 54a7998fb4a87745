"""Fixtures for the reaper, reconciler and metrics: real local (bubblewrap) and Docker
providers under a per-run root / installation label, so nothing here touches sandboxes of
other test runs sharing this machine's Docker engine."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from accounts.authentication import Principal
from sandboxes.models import Sandbox
from sandboxes.providers import get_provider, reset_providers
from sandboxes.services import sandbox_create
from tests.requirements import jail_root, missing_part

RUN_ID = uuid.uuid4().hex[:8]
INSTALLATION = f"ops-test-{RUN_ID}"


def docker_available() -> bool:
    try:
        from tests.docker_support import docker_provider_or_skip  # noqa: F401
    except ImportError:
        pass
    else:
        try:
            docker_provider_or_skip()
        except pytest.skip.Exception:
            return False
    if shutil.which("docker") is None:
        return False
    image = os.environ.get("SANDPIT_DOCKER_IMAGE", "sandpit-sandbox:latest")
    return (
        subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode == 0
    )


@pytest.fixture(scope="session")
def ops_root(tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    return jail_root("ops-sandboxes")


@pytest.fixture
def ops_providers(settings, ops_root, request):  # type: ignore[no-untyped-def]
    """Configure local (+ docker when the test is marked docker) and clean up after."""
    wants_docker = request.node.get_closest_marker("docker") is not None
    if wants_docker and not docker_available():
        missing_part("no Docker engine or sandbox image")
    names = ["local", "docker"] if wants_docker else ["local"]
    settings.SANDPIT_PROVIDERS = names
    settings.SANDPIT_DEFAULT_PROVIDER = "local"
    settings.SANDPIT_LOCAL_ROOT = ops_root
    settings.SANDPIT_INSTALLATION = INSTALLATION
    reset_providers()
    yield names
    for name in names:
        provider = get_provider(name)
        for handle in provider.list_sandboxes():
            provider.destroy(handle.provider_id)
    reset_providers()


@pytest.fixture
def principal_a(org_a, alice) -> Principal:  # type: ignore[no-untyped-def]
    return Principal(organization=org_a, user=alice)


@pytest.fixture
def make_sandbox(principal_a, ops_providers):  # type: ignore[no-untyped-def]
    """Create a real sandbox, optionally idle for `idle_s` seconds (activity in the past)."""

    def make(
        provider: str = "local", idle_s: int = 0, timeout_s: int = 60, **kwargs: object
    ) -> Sandbox:
        sandbox = sandbox_create(
            principal=principal_a, provider_name=provider, timeout_s=timeout_s, **kwargs
        )
        if idle_s:
            past = timezone.now() - timedelta(seconds=idle_s)
            Sandbox.objects.filter(pk=sandbox.pk).update(last_activity_at=past, started_at=past)
            sandbox.refresh_from_db()
        return sandbox

    return make


def provider_has(provider_name: str, provider_id: str) -> bool:
    return any(h.provider_id == provider_id for h in get_provider(provider_name).list_sandboxes())
