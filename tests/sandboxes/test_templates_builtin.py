"""Built-in templates on both providers: a python sandbox has pip and venv, a node sandbox
has npm; the default environment has neither (so the template is what provides them).

The templates are built by scripts/test.sh (cached by content); run elsewhere, the first
test builds them (minutes: apt downloads)."""

from __future__ import annotations

import pytest

from sandboxes.template_builtins import templates_builtin_build
from tests.docker_support import TEST_INSTALLATION, docker_provider_or_skip
from tests.requirements import jail_root

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def builtin_env(settings):  # type: ignore[no-untyped-def]
    from sandboxes.providers import get_provider, reset_providers

    docker_provider_or_skip()
    settings.SANDPIT_PROVIDERS = ["local", "docker"]
    settings.SANDPIT_LOCAL_ROOT = jail_root("tpl-builtin")
    settings.SANDPIT_LOCAL_WARM_POOL = 0
    settings.SANDPIT_INSTALLATION = TEST_INSTALLATION
    reset_providers()
    built = templates_builtin_build(["python", "node"])
    assert [t.state for t in built] == ["ready", "ready"], [t.error_message for t in built]
    yield
    for name in ("local", "docker"):
        provider = get_provider(name)
        for handle in provider.list_sandboxes():
            if handle.labels.get("sandpit.org") or name == "local":
                provider.destroy(handle.provider_id)
    reset_providers()


def _run(api, sandbox_id: str, command: str) -> dict:  # type: ignore[no-untyped-def]
    response = api.post(
        f"/api/v1/sandboxes/{sandbox_id}/commands", {"command": command}, format="json"
    )
    assert response.status_code == 200, response.content
    return response.json()  # type: ignore[no-any-return]


@pytest.mark.parametrize("provider", ["local", "docker"])
def test_python_has_pip_and_venv_node_has_npm(api_a, builtin_env, provider):
    listed = {t["name"]: t for t in api_a.get("/api/v1/templates").json()}
    assert listed["python"]["builtin"] and listed["python"]["state"] == "ready"
    checks = {
        "python": "pip3 --version && python3 -m venv --without-pip /tmp/v && /tmp/v/bin/python -c 'print(7*6)'",
        "node": "npm --version && node -e 'console.log(6*7)'",
    }
    for template, command in checks.items():
        created = api_a.post(
            "/api/v1/sandboxes", {"template": template, "provider": provider}, format="json"
        )
        assert created.status_code == 201, created.content
        assert created.json()["template"] == template
        out = _run(api_a, created.json()["id"], command)
        assert out["exit_code"] == 0 and out["stdout"].strip().endswith("42"), out
        api_a.delete(f"/api/v1/sandboxes/{created.json()['id']}")
    plain = api_a.post("/api/v1/sandboxes", {"provider": "docker"}, format="json").json()
    out = _run(api_a, plain["id"], "command -v pip3 npm || echo neither")
    assert out["stdout"].strip() == "neither", out
