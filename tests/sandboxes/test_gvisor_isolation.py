"""gVisor as an option: the setting, the per-organization override and where it shows."""

from __future__ import annotations

import json
import subprocess

import pytest

from accounts.models import Organization
from tests.conftest import assert_error

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def docker_sandboxes(settings):  # type: ignore[no-untyped-def]
    """local and docker enabled, docker under runc by default; every sandbox destroyed after."""
    from sandboxes.providers import get_provider, reset_providers
    from tests.docker_support import TEST_INSTALLATION, docker_runsc_provider_or_skip

    docker_runsc_provider_or_skip()
    settings.SANDPIT_PROVIDERS = ["local", "docker"]
    settings.SANDPIT_DEFAULT_PROVIDER = "local"
    settings.SANDPIT_DOCKER_RUNTIME = "runc"
    settings.SANDPIT_INSTALLATION = TEST_INSTALLATION
    reset_providers()
    yield
    provider = get_provider("docker")
    for handle in provider.list_sandboxes():
        if handle.labels.get("sandpit.org"):
            provider.destroy(handle.provider_id)
    reset_providers()


def runtime_of(container_id: str) -> str:
    out = subprocess.run(
        ["docker", "inspect", container_id], capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out)[0]["HostConfig"]["Runtime"]  # type: ignore[no-any-return]


def test_providers_say_their_isolation_and_the_org_override_shows(api_a, org_a, docker_sandboxes):
    listed = {p["name"]: p for p in api_a.get("/api/v1/providers").json()["results"]}
    assert listed["docker"]["isolation"] == "container"
    assert listed["local"]["isolation"] == "container"
    Organization.objects.filter(pk=org_a.pk).update(docker_runtime="runsc")
    listed = {p["name"]: p for p in api_a.get("/api/v1/providers").json()["results"]}
    assert listed["docker"]["isolation"] == "gvisor"


def test_org_requiring_gvisor_runs_docker_sandboxes_under_runsc(api_a, org_a, docker_sandboxes):
    Organization.objects.filter(pk=org_a.pk).update(docker_runtime="runsc")
    created = api_a.post("/api/v1/sandboxes", {"provider": "docker"}, format="json")
    assert created.status_code == 201, created.content
    sandbox = created.json()
    assert sandbox["isolation"] == "gvisor"
    assert api_a.get(f"/api/v1/sandboxes/{sandbox['id']}").json()["isolation"] == "gvisor"
    ran = api_a.post(
        f"/api/v1/sandboxes/{sandbox['id']}/commands", {"command": "dmesg"}, format="json"
    )
    assert "Starting gVisor" in ran.json()["stdout"]
    # A sandbox the org cannot put under gVisor is refused, not quietly run without it.
    assert_error(
        api_a.post("/api/v1/sandboxes", {"provider": "local"}, format="json"),
        403,
        "gvisor_required",
    )


def test_setting_runs_every_docker_sandbox_under_gvisor(api_a, settings, docker_sandboxes):
    from sandboxes.models import Sandbox
    from sandboxes.providers import reset_providers

    settings.SANDPIT_DOCKER_RUNTIME = "runsc"
    reset_providers()
    created = api_a.post("/api/v1/sandboxes", {"provider": "docker"}, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["isolation"] == "gvisor"
    row = Sandbox.objects.get(pk=created.json()["id"])
    assert runtime_of(row.provider_id) == "runsc"
