"""API conventions every endpoint shares: the error shape, schema, health, production checks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import assert_error

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.django_db
def test_unknown_api_path_is_json_404(api_a):
    assert_error(api_a.get("/api/v1/no-such-thing"), 404, "not_found")


@pytest.mark.django_db
def test_malformed_json_is_400(api_a):
    response = api_a.post("/api/v1/sandboxes", data="{not json", content_type="application/json")
    assert_error(response, 400, "malformed_request")


@pytest.mark.django_db
def test_validation_errors_name_the_field(api_a):
    response = api_a.post("/api/v1/sandboxes", {"timeout_s": "soon"}, format="json")
    error = assert_error(response, 400, "validation_error")
    assert "timeout_s" in error["message"]


@pytest.mark.django_db
def test_wrong_method_is_405_in_the_shape(api_a):
    assert_error(api_a.put("/api/v1/providers", {}, format="json"), 405, "method_not_allowed")


@pytest.mark.django_db
def test_openapi_schema_and_docs(client):
    schema = client.get("/api/schema/")
    assert schema.status_code == 200
    text = schema.content.decode()
    for path in ("/api/v1/sandboxes", "/api/v1/sandboxes/{sandbox_id}/commands", "/api/v1/run"):
        assert path in text
    assert client.get("/api/docs/").status_code == 200


@pytest.mark.django_db
def test_health_live_and_ready(client):
    assert client.get("/health/live").json() == {"status": "ok"}
    ready = client.get("/health/ready")
    body = ready.json()
    assert {"database", "channel_layer", "broker"} <= set(body["components"])
    assert body["components"]["database"]["status"] == "ok"
    assert body["components"]["channel_layer"]["status"] == "ok"
    assert body["components"]["broker"]["status"] == "ok"
    assert ready.status_code == (200 if body["status"] == "ok" else 503)


@pytest.mark.django_db
def test_ready_is_503_when_a_component_is_down(client, settings):
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"
    from playground.celery import app

    app.conf.broker_url = "redis://127.0.0.1:1/0"
    try:
        response = client.get("/health/ready")
    finally:
        app.conf.broker_url = os.environ.get("REDIS_URL") or "filesystem://"
    assert response.status_code == 503
    assert response.json()["components"]["broker"]["status"] == "down"


def test_check_deploy_is_clean_in_production_settings(tmp_path):
    env = {
        **os.environ,
        "DJANGO_ENV": "production",
        "DJANGO_SECRET_KEY": "k3Jx9-QmV2pL8rT5wZ1nB7cY4hF6gD0sA_eU3iO9pK2lM5vN8xC1zR4tW7yH0jG",
        "DJANGO_ALLOWED_HOSTS": "sandpit.example.com",
        "SANDPIT_VAR_DIR": str(tmp_path),
    }
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)  # the browser tests set it for Playwright
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_production_refuses_to_start_without_a_secret_key(tmp_path):
    env = {**os.environ, "DJANGO_ENV": "production", "DJANGO_ALLOWED_HOSTS": "x.example.com"}
    env.pop("DJANGO_SECRET_KEY", None)
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "DJANGO_SECRET_KEY" in result.stderr
