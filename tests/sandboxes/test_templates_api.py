"""The template API without building (builds: test_templates_build.py): listing, creating,
validation, tenancy, limits, hostile Dockerfiles, and what sandbox creates say about
templates that are unknown or not built."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from rest_framework.test import APIClient

from sandboxes import caller as caller_module
from sandboxes.models import BuildState, Sandbox, Template
from tests.conftest import assert_error

pytestmark = pytest.mark.django_db

TINY = "FROM sandpit\nRUN echo hello > /opt/hello\n"


@pytest.fixture
def builtin_python(db) -> Template:  # type: ignore[no-untyped-def]
    return Template.objects.create(
        organization=None,
        name="python",
        dockerfile="FROM sandpit\n",
        state=BuildState.READY,
        image="sandpit-template:builtin-python-test",
    )


@pytest.fixture
def counted(monkeypatch) -> list[str]:  # type: ignore[no-untyped-def]
    operations: list[str] = []
    monkeypatch.setattr(
        caller_module, "metering_record", lambda **kw: operations.append(kw["operation"])
    )
    return operations


def streamed(response) -> str:  # type: ignore[no-untyped-def]
    """The body of a streaming response (an async iterator, as daphne serves it)."""

    async def collect() -> bytes:
        return b"".join([chunk async for chunk in response.streaming_content])

    return async_to_sync(collect)().decode()


def _session(user) -> APIClient:  # type: ignore[no-untyped-def]
    client = APIClient()
    client.force_login(user)
    return client


def test_create_queues_a_build_counted_once_and_lists_it(api_a, builtin_python, counted):
    response = api_a.post(
        "/api/v1/templates",
        {"name": "mine", "dockerfile": TINY, "description": "hello"},
        format="json",
    )
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["state"] == "queued" and body["builtin"] is False
    assert body["progress"] == {"percent": 0, "step": 0, "steps": 0, "phase": "queued"}
    assert counted == ["template.build"]
    names = [t["name"] for t in api_a.get("/api/v1/templates").json()]
    assert names == ["python", "mine"]  # built-ins first
    detail = api_a.get(f"/api/v1/templates/{body['id']}").json()
    assert detail["dockerfile"] == TINY
    log = api_a.get(f"/api/v1/templates/{body['id']}/log?follow=false")
    assert log.status_code == 200 and log["Content-Type"].startswith("text/plain")
    text = streamed(log)
    assert "building on sandpit; network off" in text
    skipped = api_a.get(f"/api/v1/templates/{body['id']}/log?follow=false&offset=5")
    assert streamed(skipped) == text[5:]


def test_validation(api_a, counted):
    assert_error(api_a.post("/api/v1/templates", {"name": "x"}, format="json"), 400)
    for name in ("Upper", "-dash", "a" * 65, "python", "default", "sandpit"):
        assert_error(
            api_a.post("/api/v1/templates", {"name": name, "dockerfile": TINY}, format="json"),
            400,
            "validation_error",
        )
    assert_error(
        api_a.post(
            "/api/v1/templates", {"name": "ok", "dockerfile": TINY, "nework": True}, format="json"
        ),
        400,
        "validation_error",
    )
    assert counted == [] and not Template.objects.exists()


def test_unauthenticated_and_sandbox_tokens_are_refused(anon_api, api_a, sandbox_a):
    assert_error(anon_api.get("/api/v1/templates"), 401)
    assert_error(anon_api.post("/api/v1/templates", {}, format="json"), 401)
    token = api_a.post(
        f"/api/v1/sandboxes/{sandbox_a['id']}/tokens", {"scopes": ["exec"]}, format="json"
    ).json()["token"]
    holder = APIClient()
    holder.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert holder.get("/api/v1/templates").status_code in (403, 404)


def test_other_organizations_templates_are_404(api_a, api_b, org_b, builtin_python):
    theirs = Template.objects.create(organization=org_b, name="secret", dockerfile=TINY)
    for method in ("get", "delete"):
        assert_error(getattr(api_a, method)(f"/api/v1/templates/{theirs.pk}"), 404)
    assert_error(api_a.get(f"/api/v1/templates/{theirs.pk}/log"), 404)
    assert [t["name"] for t in api_a.get("/api/v1/templates").json()] == ["python"]
    # nor can a Dockerfile build on it, by name or id
    for base in ("secret", theirs.pk):
        Template.objects.filter(pk=theirs.pk).update(state=BuildState.READY, image="x:y")
        assert_error(
            api_a.post(
                "/api/v1/templates",
                {"name": "steal", "dockerfile": f"FROM {base}\n"},
                format="json",
            ),
            400,
            "dockerfile_refused",
        )
    assert Template.objects.filter(pk=theirs.pk).exists()


def test_builtins_cannot_be_deleted(api_a, builtin_python):
    assert_error(api_a.delete(f"/api/v1/templates/{builtin_python.pk}"), 403, "builtin_template")


def test_delete_refuses_while_sandboxes_use_it_then_removes_it(api_a, org_a, sandbox_a):
    mine = Template.objects.create(
        organization=org_a, name="mine", dockerfile=TINY, state=BuildState.READY
    )
    Sandbox.objects.filter(pk=sandbox_a["id"]).update(template="mine")
    assert_error(api_a.delete(f"/api/v1/templates/{mine.pk}"), 409, "template_in_use")
    Sandbox.objects.filter(pk=sandbox_a["id"]).update(state="paused")
    assert_error(api_a.delete(f"/api/v1/templates/{mine.pk}"), 409, "template_in_use")
    Sandbox.objects.filter(pk=sandbox_a["id"]).update(state="stopped")
    assert api_a.delete(f"/api/v1/templates/{mine.pk}").status_code == 204
    assert not Template.objects.filter(pk=mine.pk).exists()


def test_limits_per_organization(api_a, org_a, settings, counted):
    settings.SANDPIT_TEMPLATE_MAX_PER_ORG = 2
    first = api_a.post("/api/v1/templates", {"name": "one", "dockerfile": TINY}, format="json")
    assert first.status_code == 202
    assert_error(
        api_a.post("/api/v1/templates", {"name": "two", "dockerfile": TINY}, format="json"),
        409,
        "template_build_in_progress",
    )
    Template.objects.filter(organization=org_a).update(state=BuildState.FAILED)
    assert_error(
        api_a.post("/api/v1/templates", {"name": "one", "dockerfile": TINY}, format="json"),
        409,
        "template_exists",
    )
    assert (
        api_a.post(
            "/api/v1/templates", {"name": "two", "dockerfile": TINY}, format="json"
        ).status_code
        == 202
    )
    Template.objects.filter(organization=org_a).update(state=BuildState.FAILED)
    assert_error(
        api_a.post("/api/v1/templates", {"name": "three", "dockerfile": TINY}, format="json"),
        429,
        "template_limit_reached",
    )
    assert counted == ["template.build", "template.build"]


@pytest.mark.parametrize(
    "dockerfile",
    [
        "FROM debian:bookworm\nRUN true\n",  # not one of Sandpit's images
        "FROM docker.io/library/alpine:3\n",  # a registry: never pulled
        "FROM sandpit\nRUN --mount=type=bind,source=/,target=/host cat /host/etc/shadow\n",
        "FROM sandpit\nVOLUME /var/lib/docker\n",
        "FROM sandpit\nADD http://169.254.169.254/latest/meta-data/ /m\n",
        "FROM sandpit\nCOPY --from=sandpit-app:latest /app/.env /x\n",
    ],
)
def test_hostile_dockerfiles_are_refused(api_a, dockerfile, counted):
    error = assert_error(
        api_a.post("/api/v1/templates", {"name": "evil", "dockerfile": dockerfile}, format="json"),
        400,
        "dockerfile_refused",
    )
    assert "Line " in error["message"]
    assert counted == [] and not Template.objects.exists()


def test_a_huge_dockerfile_is_413(api_a):
    huge = "FROM sandpit\n" + "RUN true\n" * 10_000
    assert_error(
        api_a.post("/api/v1/templates", {"name": "huge", "dockerfile": huge}, format="json"),
        413,
        "dockerfile_too_large",
    )


def test_network_builds_need_a_signed_in_owner(api_a, alice, bob, org_a):
    body = {"name": "net", "dockerfile": TINY, "network": True}
    assert_error(api_a.post("/api/v1/templates", body, format="json"), 403, "role_required")
    assert_error(_session(bob).post("/api/v1/templates", body, format="json"), 403)
    response = _session(alice).post("/api/v1/templates", body, format="json")
    assert response.status_code == 202, response.content
    assert "network on (asked by an owner)" in Template.objects.get().build_log


def test_sandbox_creates_name_templates_strictly(api_a, org_a, local_sandboxes):
    error = assert_error(
        api_a.post("/api/v1/sandboxes", {"template": "nope"}, format="json"),
        400,
        "template_not_found",
    )
    assert "GET /api/v1/templates" in error["message"]
    for state in (BuildState.QUEUED, BuildState.BUILDING, BuildState.FAILED):
        Template.objects.update_or_create(
            organization=org_a, name="wip", defaults={"dockerfile": TINY, "state": state}
        )
        assert_error(
            api_a.post("/api/v1/sandboxes", {"template": "wip"}, format="json"),
            409,
            "template_not_ready",
        )
    assert not Sandbox.objects.filter(template="wip").exists()
    default = api_a.post("/api/v1/sandboxes", {}, format="json")
    assert default.status_code == 201 and default.json()["template"] == "default"


def test_a_build_whose_worker_stopped_fails_instead_of_blocking(api_a, org_a, settings):
    from datetime import timedelta

    from django.utils import timezone

    settings.SANDPIT_TEMPLATE_BUILD_TIMEOUT_S = 60
    lost = Template.objects.create(
        organization=org_a, name="lost", dockerfile=TINY, state=BuildState.BUILDING
    )
    assert_error(api_a.delete(f"/api/v1/templates/{lost.pk}"), 409, "template_building")
    Template.objects.filter(pk=lost.pk).update(
        created_at=timezone.now() - timedelta(seconds=60 + 301)
    )
    response = api_a.post("/api/v1/templates", {"name": "next", "dockerfile": TINY}, format="json")
    assert response.status_code == 202, response.content
    lost.refresh_from_db()
    assert lost.state == BuildState.FAILED and "stopped" in lost.error_message
    assert api_a.delete(f"/api/v1/templates/{lost.pk}").status_code == 204


def test_a_build_goes_to_the_celery_task_which_builds_only_queued_templates(
    api_a, org_a, builtin_python, monkeypatch, django_capture_on_commit_callbacks
):
    from playground.celery import app
    from sandboxes import template_builds

    sent: list[tuple[str, list[str], dict[str, bool]]] = []
    monkeypatch.setattr(
        template_builds.current_app,
        "send_task",
        lambda name, args, kwargs: sent.append((name, args, kwargs)),
    )
    with django_capture_on_commit_callbacks(execute=True):
        created = api_a.post(
            "/api/v1/templates", {"name": "mine", "dockerfile": "FROM python\n"}, format="json"
        ).json()
    assert sent == [("sandboxes.tasks.build_template", [created["id"]], {"network": False})]
    # the base went away meanwhile: the task fails the build without reaching the engine
    Template.objects.filter(pk=builtin_python.pk).update(state=BuildState.FAILED)
    app.loader.import_default_modules()  # what a worker does at start: autodiscovery
    task = app.tasks["sandboxes.tasks.build_template"]
    task(created["id"])
    mine = Template.objects.get(pk=created["id"])
    assert mine.state == BuildState.FAILED and "FROM python is not available" in mine.error_message
    task(created["id"])  # a second delivery does nothing
    assert Template.objects.get(pk=created["id"]).error_message == mine.error_message
