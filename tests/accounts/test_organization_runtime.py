"""An owner requires gVisor for the organization (PATCH /api/v1/organization
{"docker_runtime"}), and the docker sandboxes created afterwards run under it."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from accounts.models import Membership, Organization, Role
from tests.conftest import assert_error


def _session(user) -> APIClient:  # type: ignore[no-untyped-def]
    client = APIClient()
    client.force_login(user)
    return client


@pytest.fixture
def docker_enabled(settings):  # type: ignore[no-untyped-def]
    settings.SANDPIT_PROVIDERS = ["local", "docker"]


@pytest.mark.django_db
def test_owner_requires_gvisor_and_opts_back_out(alice, org_a, docker_enabled):  # type: ignore[no-untyped-def]
    owner = _session(alice)
    assert owner.get("/api/v1/organization").json()["docker_runtime"] == ""
    changed = owner.patch("/api/v1/organization", {"docker_runtime": "runsc"}, format="json")
    assert changed.status_code == 200, changed.content
    assert changed.json()["docker_runtime"] == "runsc"
    # Only the field sent changes: the network setting stays as it was.
    assert changed.json()["allow_network"] is False
    org_a.refresh_from_db()
    assert org_a.docker_runtime == "runsc"
    for value in ("runc", ""):
        assert (
            owner.patch("/api/v1/organization", {"docker_runtime": value}, format="json").json()[
                "docker_runtime"
            ]
            == value
        )
        org_a.refresh_from_db()
        assert org_a.docker_runtime == value
    both = owner.patch(
        "/api/v1/organization", {"allow_network": True, "docker_runtime": "runsc"}, format="json"
    ).json()
    assert (both["allow_network"], both["docker_runtime"]) == (True, "runsc")


@pytest.mark.django_db
def test_only_signed_in_owners_change_the_runtime(  # type: ignore[no-untyped-def]
    api_a, anon_api, alice, bob, charlie, org_a, org_b, docker_enabled
):
    body = {"docker_runtime": "runsc"}
    assert_error(_session(bob).patch("/api/v1/organization", body, format="json"), 403)
    Membership.objects.filter(user=bob, organization=org_a).update(role=Role.ADMIN)
    assert_error(
        _session(bob).patch("/api/v1/organization", body, format="json"), 403, "role_required"
    )
    # An owner's key acts without a person to answer for the change: refused as for network.
    assert_error(api_a.patch("/api/v1/organization", body, format="json"), 403)
    assert_error(anon_api.patch("/api/v1/organization", body, format="json"), 401)
    # Charlie owns another organization: his change lands there, never on org A.
    assert _session(charlie).patch("/api/v1/organization", body, format="json").status_code == 200
    org_a.refresh_from_db()
    org_b.refresh_from_db()
    assert (org_a.docker_runtime, org_b.docker_runtime) == ("", "runsc")


@pytest.mark.django_db
def test_unknown_runtime_values_are_refused(alice, org_a, docker_enabled):  # type: ignore[no-untyped-def]
    owner = _session(alice)
    for bad in ("gvisor", "RUNSC", "kata", 1, True, None, ["runsc"]):
        refused = assert_error(
            owner.patch("/api/v1/organization", {"docker_runtime": bad}, format="json"),
            400,
            "validation_error",
        )
        assert refused["message"].startswith("docker_runtime: "), refused
    refused = assert_error(
        owner.patch("/api/v1/organization", {"docker_runtime": "kata"}, format="json"), 400
    )
    assert '"runc" or "runsc"' in refused["message"]
    # An empty body changes nothing and says what it takes.
    empty = assert_error(owner.patch("/api/v1/organization", {}, format="json"), 400)
    assert "docker_runtime" in empty["message"]
    org_a.refresh_from_db()
    assert org_a.docker_runtime == ""


@pytest.mark.django_db
def test_requiring_gvisor_without_the_docker_provider_is_refused(alice, org_a, settings):  # type: ignore[no-untyped-def]
    settings.SANDPIT_PROVIDERS = ["local"]
    owner = _session(alice)
    refused = assert_error(
        owner.patch("/api/v1/organization", {"docker_runtime": "runsc"}, format="json"),
        409,
        "gvisor_unavailable",
    )
    assert "SANDPIT_PROVIDERS" in refused["message"]
    # Opting out needs no docker.
    assert (
        owner.patch("/api/v1/organization", {"docker_runtime": "runc"}, format="json").status_code
        == 200
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.docker
def test_docker_sandbox_created_after_the_owner_requires_gvisor_runs_under_it(  # type: ignore[no-untyped-def]
    alice, api_a, org_a, settings
):
    from sandboxes.providers import get_provider, reset_providers
    from tests.docker_support import TEST_INSTALLATION, docker_runsc_provider_or_skip

    docker_runsc_provider_or_skip()
    settings.SANDPIT_PROVIDERS = ["local", "docker"]
    settings.SANDPIT_DEFAULT_PROVIDER = "local"
    settings.SANDPIT_DOCKER_RUNTIME = "runc"
    settings.SANDPIT_INSTALLATION = TEST_INSTALLATION
    reset_providers()
    try:
        before = api_a.post("/api/v1/sandboxes", {"provider": "docker"}, format="json")
        assert before.status_code == 201, before.content
        assert before.json()["isolation"] == "container"
        changed = _session(alice).patch(
            "/api/v1/organization", {"docker_runtime": "runsc"}, format="json"
        )
        assert changed.status_code == 200, changed.content
        after = api_a.post("/api/v1/sandboxes", {"provider": "docker"}, format="json")
        assert after.status_code == 201, after.content
        assert after.json()["isolation"] == "gvisor"
        assert api_a.get(f"/api/v1/sandboxes/{after.json()['id']}").json()["isolation"] == "gvisor"
        ran = api_a.post(
            f"/api/v1/sandboxes/{after.json()['id']}/commands", {"command": "dmesg"}, format="json"
        )
        assert "Starting gVisor" in ran.json()["stdout"]
        # The sandbox made before keeps the runtime it was created with.
        assert api_a.get(f"/api/v1/sandboxes/{before.json()['id']}").json()["isolation"] == (
            "container"
        )
        assert Organization.objects.get(pk=org_a.pk).docker_runtime == "runsc"
    finally:
        provider = get_provider("docker")
        for handle in provider.list_sandboxes():
            if handle.labels.get("sandpit.org"):
                provider.destroy(handle.provider_id)
        reset_providers()
