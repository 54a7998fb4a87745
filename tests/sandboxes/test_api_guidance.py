"""The API says what it expected: a misspelt or misplaced field, a body without its media type,
a key without its scheme, a read without a path and a trailing slash each get an error that
names the fix, in the one error shape, in development (DEBUG) and production alike."""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.test import APIClient

from accounts.models import Invitation
from sandboxes.models import Sandbox
from tests.conftest import assert_error

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=[True, False], ids=["debug", "production"])
def debug(request, settings):  # type: ignore[no-untyped-def]
    settings.DEBUG = request.param
    return request.param


def _client(authorization: str | None = None) -> APIClient:
    client = APIClient()
    if authorization is not None:
        client.credentials(HTTP_AUTHORIZATION=authorization)
    return client


# --- fields the endpoint does not declare ------------------------------------------------------


def test_a_misspelt_field_is_named_with_the_field_meant(api_a, local_sandboxes, debug):
    response = api_a.post("/api/v1/sandboxes", {"templat": "default"}, format="json")
    error = assert_error(response, 400, "validation_error")
    assert error["message"].startswith("templat: ")
    assert "did you mean template?" in error["message"]
    assert set(error["details"]) == {"templat"}
    assert not Sandbox.objects.exists()  # nothing was created with the default template


def test_a_field_at_the_wrong_level_says_where_it_belongs(api_a, local_sandboxes, debug):
    response = api_a.post("/api/v1/sandboxes", {"memory_mb": 256}, format="json")
    error = assert_error(response, 400, "validation_error")
    assert error["message"].startswith("memory_mb: ")
    assert "belongs in resources" in error["message"]

    response = api_a.post(
        "/api/v1/sandboxes", {"resources": {"memory_mb": 256, "timeout_s": 60}}, format="json"
    )
    error = assert_error(response, 400, "validation_error")
    assert error["message"].startswith("resources: timeout_s: ")
    assert "belongs at the top level" in error["message"]
    assert not Sandbox.objects.exists()


def test_unknown_fields_are_reported_with_the_other_errors(api_a, sandbox_a):
    response = api_a.post(
        f"/api/v1/sandboxes/{sandbox_a['id']}/commands",
        {"cmd": "true", "timeout_s": "soon"},
        format="json",
    )
    error = assert_error(response, 400, "validation_error")
    assert error["message"].startswith("cmd: ")
    assert "did you mean command?" in error["message"]
    assert set(error["details"]) == {"cmd", "command", "timeout_s"}


def test_correct_bodies_still_pass(api_a, sandbox_a):
    response = api_a.post(
        f"/api/v1/sandboxes/{sandbox_a['id']}/code",
        {"code": "print(input())", "language": "python", "stdin": "hi\n", "timeout_s": 10},
        format="json",
    )
    assert response.status_code == 200, response.content
    assert response.json()["stdout"] == "hi\n"
    response = api_a.post(
        f"/api/v1/sandboxes/{sandbox_a['id']}/files/move", {"from": "a", "to": "b"}, format="json"
    )
    assert response.status_code != 400 or "unknown field" not in response.content.decode()


def test_unknown_fields_are_refused_on_account_and_billing_endpoints(client: Client, alice, org_a):
    client.force_login(alice)
    response = client.post(
        "/api/v1/invitations",
        {"email": "dana@example.com", "rol": "admin"},
        content_type="application/json",
    )
    error = assert_error(response, 400, "validation_error")
    assert "did you mean role?" in error["message"]
    assert not Invitation.objects.exists()

    response = client.put(
        "/api/v1/billing/spending-cap", {"cap": 500}, content_type="application/json"
    )
    error = assert_error(response, 400, "validation_error")
    assert error["message"].startswith("cap: ")
    assert "did you mean cap_cents?" in error["message"]


def test_unknown_query_parameter_on_the_sandbox_list_is_named(api_a, debug):
    error = assert_error(api_a.get("/api/v1/sandboxes?stat=running"), 400, "validation_error")
    assert "stat" in error["message"] and "state" in error["message"]
    assert api_a.get("/api/v1/sandboxes?state=running&all=true&limit=5&offset=0").status_code == 200


# --- the body's media type -----------------------------------------------------------------------


def test_a_json_body_without_its_content_type_says_which_to_send(api_a, sandbox_a, debug):
    url = f"/api/v1/sandboxes/{sandbox_a['id']}/commands"
    # What `curl -d '{"command": "ls"}'` sends.
    response = api_a.generic(
        "POST", url, b'{"command": "ls"}', content_type="application/x-www-form-urlencoded"
    )
    error = assert_error(response, 415, "unsupported_media_type")
    assert "Send Content-Type: application/json" in error["message"]

    response = api_a.generic("POST", url, b'{"command": "ls"}', content_type="")
    error = assert_error(response, 415, "unsupported_media_type")
    assert "Send Content-Type: application/json" in error["message"]


# --- the Authorization header ---------------------------------------------------------------------


def test_an_api_key_without_bearer_says_how_to_send_it(key_a, debug):
    response = _client(key_a).get("/api/v1/sandboxes")
    error = assert_error(response, 401, "not_authenticated")
    assert error["message"].startswith("Use Authorization: Bearer sp_…")
    assert key_a not in response.content.decode()


@pytest.mark.parametrize("scheme", ["Token", "Basic", "ApiKey"])
def test_another_scheme_says_to_use_bearer(key_a, scheme):
    response = _client(f"{scheme} {key_a}").get("/api/v1/sandboxes")
    error = assert_error(response, 401, "not_authenticated")
    assert f"'{scheme}'" in error["message"]
    assert "Authorization: Bearer sp_" in error["message"]
    assert key_a not in response.content.decode()


def test_a_sandbox_token_without_bearer_says_how_to_send_it(api_a, sandbox_a, debug):
    minted = api_a.post(
        f"/api/v1/sandboxes/{sandbox_a['id']}/tokens", {"scopes": ["exec"]}, format="json"
    )
    assert minted.status_code == 201, minted.content
    token = minted.json()["token"]
    response = _client(token).get(f"/api/v1/sandboxes/{sandbox_a['id']}")
    error = assert_error(response, 401, "not_authenticated")
    assert "Authorization: Bearer <sandbox token>" in error["message"]
    assert token not in response.content.decode()
    assert _client(f"Bearer {token}").get(f"/api/v1/sandboxes/{sandbox_a['id']}").status_code == 200


def test_bearer_with_something_else_says_what_bearer_takes(db):
    error = assert_error(_client("Bearer hunter2").get("/api/v1/sandboxes"), 401)
    assert "API key (sp_…) or a sandbox token" in error["message"]


def test_no_authorization_header_keeps_the_plain_message(anon_api):
    error = assert_error(anon_api.get("/api/v1/sandboxes"), 401, "not_authenticated")
    assert "Bearer" not in error["message"]


# --- reading a file ------------------------------------------------------------------------------


def test_a_file_read_without_path_says_path_is_required(api_a, sandbox_a, debug):
    for query in ("", "?path=", "?paht=a.txt"):
        response = api_a.get(f"/api/v1/sandboxes/{sandbox_a['id']}/files/content{query}")
        error = assert_error(response, 400, "validation_error")
        assert error["message"].startswith("path is required")


# --- trailing slashes --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "meant"),
    [
        ("/api/v1/sandboxes/", "/api/v1/sandboxes"),
        ("/api/v1/sandboxes/sbx_x/commands/", "/api/v1/sandboxes/sbx_x/commands"),
        ("/api/v1/billing/spending-cap/", "/api/v1/billing/spending-cap"),
    ],
)
def test_a_trailing_slash_points_to_the_path_without_it(api_a, debug, path, meant):
    for method in ("get", "post"):
        response = getattr(api_a, method)(path)
        assert response["Content-Type"].startswith("application/json")
        error = assert_error(response, 404, "not_found")
        assert error["message"].endswith(f"use {meant}")
        assert len(response.content) < 300


def test_an_unknown_path_with_a_slash_gets_the_plain_404(api_a, debug):
    error = assert_error(api_a.get("/api/v1/nothing/"), 404, "not_found")
    assert "trailing slash" not in error["message"]


# --- organization management with an API key ---------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("post", "/api/v1/invitations", {"email": "dana@example.com"}),
        ("get", "/api/v1/invitations", None),
        ("put", "/api/v1/billing/spending-cap", {"cap_cents": 500}),
        ("post", "/api/v1/billing/plan", {"plan": "free"}),
        ("post", "/api/v1/api-keys", {"name": "ci"}),
    ],
)
def test_an_owners_key_is_told_that_keys_cannot_manage_the_organization(
    api_a, org_a, method, path, body
):
    response = getattr(api_a, method)(path, body, format="json")
    error = assert_error(response, 403, "permission_denied")
    assert "API keys and sandbox tokens cannot manage the organization" in error["message"]
    assert "signed in" in error["message"]
    org_a.refresh_from_db()
    assert org_a.spending_cap_cents != 500
    assert not Invitation.objects.exists()


def test_a_member_session_keeps_the_role_message(client: Client, bob, org_a):
    client.force_login(bob)
    response = client.put(
        "/api/v1/billing/spending-cap", {"cap_cents": 500}, content_type="application/json"
    )
    error = assert_error(response, 403, "permission_denied")
    assert error["message"] == "Only organization owners and admins can do this."


def test_an_owners_session_still_manages(client: Client, alice, org_a):
    client.force_login(alice)
    response = client.put(
        "/api/v1/billing/spending-cap", {"cap_cents": 500}, content_type="application/json"
    )
    assert response.status_code == 200, response.content
    assert response.json() == {"cap_cents": 500}
