"""E2B's `Sandbox.create(template=...)` names Sandpit templates too: a built-in or the
organization's own starts that template; another organization's is E2B's 404."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from sandboxes.models import BuildState, Sandbox, Template
from sandboxes.template_builtins import templates_builtin_build
from tests.docker_support import docker_provider_or_skip

pytestmark = pytest.mark.django_db(transaction=True)


def e2b_client(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_X_API_KEY=key)
    return client


def test_a_sandpit_template_by_its_name(key_a, api_a, org_b, local_sandboxes):
    docker_provider_or_skip()  # the built-in's root file system is built with Docker
    [python] = templates_builtin_build(["python"])
    assert python.state == BuildState.READY, python.error_message
    created = e2b_client(key_a).post("/e2b/v2/sandboxes", {"templateID": "python"}, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["templateID"] == "python"
    sandbox_id = created.json()["sandboxID"]
    assert Sandbox.objects.get(pk=sandbox_id).template == "python"
    out = api_a.post(
        f"/api/v1/sandboxes/{sandbox_id}/commands", {"command": "pip3 --version"}, format="json"
    ).json()
    assert out["exit_code"] == 0 and out["stdout"].startswith("pip "), out

    Template.objects.create(organization=org_b, name="theirs", dockerfile="FROM sandpit\n")
    refused = e2b_client(key_a).post("/e2b/v2/sandboxes", {"templateID": "theirs"}, format="json")
    assert refused.status_code == 404, refused.content
    base = e2b_client(key_a).post("/e2b/v2/sandboxes", {"templateID": "base"}, format="json")
    assert base.status_code == 201 and base.json()["templateID"] == "base", base.content
    assert Sandbox.objects.get(pk=base.json()["sandboxID"]).template == "default"
