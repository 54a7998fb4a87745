from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import ApiKey
from accounts.services import api_key_create, api_key_revoke
from tests.conftest import assert_error

pytestmark = pytest.mark.django_db


def _client(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def test_key_secret_is_not_stored_in_plain_text(org_a, alice):
    issued = api_key_create(organization=org_a, name="ci", created_by=alice)
    assert issued.secret.startswith("sp_")
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM accounts_apikey WHERE id = %s", [issued.api_key.pk])
        row = cursor.fetchone()
    assert all(issued.secret not in str(value) for value in row)
    secret_body = issued.secret[len("sp_") + 8 :]
    assert all(secret_body not in str(value) for value in row)
    stored = ApiKey.objects.get(pk=issued.api_key.pk)
    assert len(stored.hashed_secret) == 64 and stored.prefix == issued.secret[3:11]


def test_valid_key_authenticates_and_records_last_use(org_a, alice):
    issued = api_key_create(organization=org_a, name="ci", created_by=alice)
    response = _client(issued.secret).get("/api/v1/organization")
    assert response.status_code == 200
    assert response.json()["slug"] == "org-a"
    assert ApiKey.objects.get(pk=issued.api_key.pk).last_used_at is not None


def test_unknown_key_gets_401(db):
    assert_error(_client("sp_deadbeef" + "x" * 40).get("/api/v1/organization"), 401)


def test_tampered_key_with_valid_prefix_gets_401(org_a):
    issued = api_key_create(organization=org_a, name="ci")
    tampered = issued.secret[:-4] + ("AAAA" if not issued.secret.endswith("AAAA") else "BBBB")
    assert_error(_client(tampered).get("/api/v1/organization"), 401)


def test_revoked_key_gets_401(org_a):
    issued = api_key_create(organization=org_a, name="ci")
    api_key_revoke(api_key=issued.api_key)
    assert_error(_client(issued.secret).get("/api/v1/organization"), 401, "authentication_failed")


def test_expired_key_gets_401(org_a):
    issued = api_key_create(
        organization=org_a, name="ci", expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert_error(_client(issued.secret).get("/api/v1/organization"), 401)


def test_missing_credentials_get_401(anon_api):
    assert_error(anon_api.get("/api/v1/sandboxes"), 401, "not_authenticated")


def test_owner_creates_lists_and_revokes_keys_in_the_browser_session(client, org_a, alice):
    client.force_login(alice)
    created = client.post("/api/v1/api-keys", {"name": "deploy"}, content_type="application/json")
    assert created.status_code == 201
    body = created.json()
    assert body["secret"].startswith("sp_") and body["prefix"] == body["secret"][3:11]
    listed = client.get("/api/v1/api-keys").json()["results"]
    assert [k["name"] for k in listed] == ["deploy"]
    assert "secret" not in listed[0] and "hashed_secret" not in listed[0]
    assert client.delete(f"/api/v1/api-keys/{body['id']}").json()["revoked"] is True
    assert_error(_client(body["secret"]).get("/api/v1/organization"), 401)


def test_member_cannot_create_keys(client, org_a, bob):
    client.force_login(bob)
    response = client.post("/api/v1/api-keys", {"name": "x"}, content_type="application/json")
    assert_error(response, 403)
    assert not ApiKey.objects.filter(organization=org_a).exists()


def test_api_key_cannot_mint_more_keys(api_a):
    assert_error(api_a.post("/api/v1/api-keys", {"name": "x"}, format="json"), 403)


def test_key_of_other_org_cannot_be_revoked(client, org_a, org_b, alice, charlie):
    other = api_key_create(organization=org_b, name="b")
    client.force_login(alice)
    assert_error(client.delete(f"/api/v1/api-keys/{other.api_key.pk}"), 404)
    assert ApiKey.objects.get(pk=other.api_key.pk).revoked_at is None


def test_create_api_key_command_prints_a_working_secret(org_a):
    out = io.StringIO()
    call_command("create_api_key", "org-a", "script", stdout=out)
    secret = out.getvalue().strip()
    assert secret.startswith("sp_")
    assert _client(secret).get("/api/v1/organization").json()["slug"] == "org-a"


def test_create_api_key_command_unknown_org(db):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="No organization"):
        call_command("create_api_key", "nope", "x")
