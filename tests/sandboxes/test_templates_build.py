"""Template builds on the real engine, end to end: the API starts a build (in a thread of
this process: SANDPIT_TEMPLATE_BUILDER=thread, the same service Celery runs), the log
streams, and sandboxes start from the result on local (a read-only root file system) and
docker (the image). Failures: no network in builds, the time and size limits."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings

from sandboxes.models import Template
from tests.conftest import assert_error
from tests.requirements import jail_root

pytestmark = pytest.mark.django_db(transaction=True)

MARKED = (
    "FROM sandpit\n"
    "USER root\n"
    "RUN echo built-by-template > /opt/marker && chown 1000 /opt/marker && chmod 666 /opt/marker\n"
    "USER 1000:1000\n"
)


@pytest.fixture
def template_env(settings):  # type: ignore[no-untyped-def]
    """Builds in a thread, roots under a passable per-test directory, local and docker."""
    from sandboxes.providers import get_provider, reset_providers
    from tests.docker_support import TEST_INSTALLATION, docker_provider_or_skip

    docker_provider_or_skip()
    settings.SANDPIT_TEMPLATE_BUILDER = "thread"
    settings.SANDPIT_TEMPLATE_ROOT = jail_root("templates")
    settings.SANDPIT_PROVIDERS = ["local", "docker"]
    settings.SANDPIT_DEFAULT_PROVIDER = "local"
    settings.SANDPIT_LOCAL_ROOT = jail_root("tpl-jails")
    settings.SANDPIT_LOCAL_WARM_POOL = 0
    settings.SANDPIT_INSTALLATION = TEST_INSTALLATION
    reset_providers()
    yield
    for name in ("local", "docker"):
        provider = get_provider(name)
        for handle in provider.list_sandboxes():
            if handle.labels.get("sandpit.org") or name == "local":
                provider.destroy(handle.provider_id)
    reset_providers()
    for template in Template.objects.exclude(organization=None):
        template.delete()  # removes image and root file system on commit
    shutil.rmtree(settings.SANDPIT_LOCAL_ROOT, ignore_errors=True)
    shutil.rmtree(settings.SANDPIT_TEMPLATE_ROOT, ignore_errors=True)


def streamed(response) -> str:  # type: ignore[no-untyped-def]
    async def collect() -> bytes:
        return b"".join([chunk async for chunk in response.streaming_content])

    return async_to_sync(collect)().decode()


def build(api, name: str, dockerfile: str) -> tuple[dict, str]:  # type: ignore[no-untyped-def]
    """Ask for a build, follow its log to the end; (the template as the API shows it, log)."""
    response = api.post(
        "/api/v1/templates", {"name": name, "dockerfile": dockerfile}, format="json"
    )
    assert response.status_code == 202, response.content
    template_id = response.json()["id"]
    log = streamed(api.get(f"/api/v1/templates/{template_id}/log"))  # ends with the build
    return api.get(f"/api/v1/templates/{template_id}").json(), log


def image_exists(tag: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0


def run(api, sandbox_id: str, command: str) -> dict:  # type: ignore[no-untyped-def]
    response = api.post(
        f"/api/v1/sandboxes/{sandbox_id}/commands", {"command": command}, format="json"
    )
    assert response.status_code == 200, response.content
    return response.json()  # type: ignore[no-any-return]


def test_a_template_builds_streams_its_log_and_runs_on_local_and_docker(api_a, template_env):
    template, log = build(api_a, "marked", MARKED)
    assert template["state"] == "ready", (template, log)
    assert template["progress"]["percent"] == 100 and template["progress"]["steps"] == 4
    assert "Step 1/4 : FROM sandpit-sandbox" in log and "==> exporting" in log
    assert log.rstrip().endswith("==> ready: " + ", ".join(template["languages"]))
    assert {"bash", "python"} <= set(template["languages"])
    assert not {"go", "rust", "java"} & set(template["languages"])
    row = Template.objects.get(pk=template["id"])
    root = Path(row.rootfs)
    assert root.is_relative_to(settings.SANDPIT_TEMPLATE_ROOT) and image_exists(row.image)
    # root's, writable by nobody else, whatever the Dockerfile chose (uid 1000, mode 666)
    for path in (root, root / "opt" / "marker", root / "workspace", root / "usr" / "bin"):
        info = path.lstat()
        assert (info.st_uid, info.st_gid, info.st_mode & 0o022) == (0, 0, 0), path

    for provider in ("local", "docker"):
        created = api_a.post(
            "/api/v1/sandboxes", {"template": "marked", "provider": provider}, format="json"
        )
        assert created.status_code == 201, created.content
        sandbox = created.json()
        assert sandbox["template"] == "marked"
        out = run(
            api_a,
            sandbox["id"],
            "cat /opt/marker; echo x > /opt/marker || echo read-only;"
            " echo w > /workspace/f && cat /workspace/f; python3 -c 'print(6*7)'",
        )
        assert out["stdout"].split() == ["built-by-template", "read-only", "w", "42"], out
        assert_error(api_a.delete(f"/api/v1/templates/{row.pk}"), 409, "template_in_use")
        assert api_a.delete(f"/api/v1/sandboxes/{sandbox['id']}").status_code == 200

    assert api_a.delete(f"/api/v1/templates/{row.pk}").status_code == 204
    assert not image_exists(row.image) and not root.exists()


def test_builds_have_no_network_and_failures_say_why(api_a, template_env):
    template, log = build(
        api_a,
        "online",
        "FROM sandpit\nRUN python3 -c \"import socket; socket.create_connection(('deb.debian.org', 80), 5)\"\n",
    )
    assert template["state"] == "failed", template
    assert "returned a non-zero code" in template["error_message"]
    assert "gaierror" in log or "unreachable" in log, log
    assert template["progress"]["phase"] == "failed"
    assert not image_exists(f"sandpit-template:{template['id'].replace('_', '-')}")
    assert_error(
        api_a.post("/api/v1/sandboxes", {"template": "online"}, format="json"),
        409,
        "template_not_ready",
    )


def test_the_time_and_size_limits_fail_a_build(api_a, template_env, settings):
    settings.SANDPIT_TEMPLATE_BUILD_TIMEOUT_S = 3
    slow, _ = build(api_a, "slow", "FROM sandpit\nRUN sleep 120\n")
    assert slow["state"] == "failed" and "longer than 3 s" in slow["error_message"], slow
    running = subprocess.run(
        ["docker", "ps", "--no-trunc", "--format", "{{.Command}}"], capture_output=True, text=True
    ).stdout
    assert "sleep 120" not in running  # the engine cancelled the step

    settings.SANDPIT_TEMPLATE_BUILD_TIMEOUT_S = 300
    settings.SANDPIT_TEMPLATE_MAX_IMAGE_MB = 1
    big, _ = build(api_a, "big", MARKED)
    assert big["state"] == "failed" and "limited to 1 MiB" in big["error_message"], big
    assert not image_exists(f"sandpit-template:{big['id'].replace('_', '-')}")
    assert not (Path(settings.SANDPIT_TEMPLATE_ROOT) / big["id"].replace("_", "-")).exists()
    assert os.path.isdir(settings.SANDPIT_TEMPLATE_ROOT)


def test_deleting_an_organization_removes_its_templates_images_and_roots(org_b, template_env):
    tag = "sandpit-template:tpl-org-cascade-test"
    subprocess.run(["docker", "tag", settings.SANDPIT_DOCKER_IMAGE, tag], check=True)
    root = Path(settings.SANDPIT_TEMPLATE_ROOT) / "tpl-org-cascade-test"
    (root / "usr" / "bin").mkdir(parents=True)
    Template.objects.create(
        organization=org_b, name="gone", dockerfile=MARKED, image=tag, rootfs=str(root)
    )
    org_b.delete()
    assert not Template.objects.filter(name="gone").exists()
    assert not image_exists(tag) and not root.exists()
    assert image_exists(settings.SANDPIT_DOCKER_IMAGE)  # the base stays


def test_an_owner_may_give_one_build_the_network(alice, org_a, template_env):
    """A server on the host's side of Docker's bridge: reached from a build only when an
    owner asked for the network (the offline case is the test above)."""
    import http.server
    import ipaddress
    import json
    import threading

    from rest_framework.test import APIClient

    ipam = json.loads(
        subprocess.run(
            ["docker", "network", "inspect", "bridge"], capture_output=True, text=True, check=True
        ).stdout
    )[0]["IPAM"]["Config"][0]
    # The bridge's own address: the gateway, by default the subnet's first address.
    gateway = ipam.get("Gateway") or str(next(ipaddress.ip_network(ipam["Subnet"]).hosts()))
    server = http.server.HTTPServer((gateway, 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    owner = APIClient()
    owner.force_login(alice)
    fetch = (
        'FROM sandpit\nRUN python3 -c "import urllib.request; '
        f"print(urllib.request.urlopen('http://{gateway}:{server.server_port}/', timeout=10).status)\"\n"
    )
    try:
        response = owner.post(
            "/api/v1/templates",
            {"name": "online", "dockerfile": fetch, "network": True},
            format="json",
        )
        assert response.status_code == 202, response.content
        template_id = response.json()["id"]
        log = streamed(owner.get(f"/api/v1/templates/{template_id}/log"))
    finally:
        server.shutdown()
    template = owner.get(f"/api/v1/templates/{template_id}").json()
    assert template["state"] == "ready", (template, log)
    assert "network on (asked by an owner)" in log and "\n200\n" in log, log
