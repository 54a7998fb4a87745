"""Django's middleware, run inline under ASGI (playground/middleware.py), still does its job:
CSRF, sessions, messages and security headers, through the real ASGI handler."""

from __future__ import annotations

import re

import pytest
from asgiref.sync import async_to_sync
from django.core.checks.security import base as security_checks
from django.core.checks.security import csrf as csrf_checks
from django.test import AsyncClient, override_settings

pytestmark = pytest.mark.django_db


def _csrf_token(html: str) -> str:
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert match, "the login form carries a CSRF token"
    return match.group(1)


def test_login_csrf_session_and_messages_under_asgi(alice, org_a, org_b):  # type: ignore[no-untyped-def]
    client = AsyncClient(enforce_csrf_checks=True)
    get, post = async_to_sync(client.get), async_to_sync(client.post)

    page = get("/accounts/login/")
    assert page.status_code == 200
    assert page["X-Frame-Options"] == "DENY"
    assert page["X-Content-Type-Options"] == "nosniff"
    assert "csrftoken" in page.cookies
    form = {"username": "alice@example.com", "password": "correct horse battery"}

    refused = post("/accounts/login/", form)
    assert refused.status_code == 403  # no token: the CSRF check ran

    logged_in = post("/accounts/login/", {**form, "csrfmiddlewaretoken": _csrf_token(page.text)})
    assert logged_in.status_code == 302
    assert "sessionid" in logged_in.cookies  # the session was saved (hop to a thread)
    assert get("/").status_code == 200

    # A message is stored in one request and shown, then consumed, in the next.
    dashboard = get("/")
    switched = post(
        "/organizations/switch/",
        {"organization": org_b.pk, "csrfmiddlewaretoken": _csrf_token(dashboard.text)},
    )
    assert switched.status_code == 302
    assert "not a member of that organization" in get("/").text
    assert "not a member of that organization" not in get("/").text


def test_api_requests_get_security_headers_and_no_session(key_a):  # type: ignore[no-untyped-def]
    response = async_to_sync(AsyncClient().get)(
        "/api/v1/sandboxes", headers={"Authorization": f"Bearer {key_a}"}
    )
    assert response.status_code == 200
    assert response["X-Frame-Options"] == "DENY"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert "sessionid" not in response.cookies
    assert "Cookie" not in response.get("Vary", "")  # the session was never touched


def test_deploy_checks_still_see_the_subclassed_middleware():  # type: ignore[no-untyped-def]
    assert security_checks.check_security_middleware(None) == []
    assert security_checks.check_xframe_options_middleware(None) == []
    assert csrf_checks.check_csrf_middleware(None) == []
    # The checks that only run when the middleware is installed still fire.
    with override_settings(SECURE_HSTS_SECONDS=0):
        assert [w.id for w in security_checks.check_sts(None)] == ["security.W004"]
    with override_settings(X_FRAME_OPTIONS="SAMEORIGIN"):
        assert [w.id for w in security_checks.check_xframe_deny(None)] == ["security.W019"]
    with override_settings(CSRF_COOKIE_SECURE=False):
        assert [w.id for w in csrf_checks.check_csrf_cookie_secure(None)] == ["security.W016"]
