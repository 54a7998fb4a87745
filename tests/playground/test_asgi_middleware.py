"""Django's middleware, run inline under ASGI (playground/middleware.py), still does its job:
CSRF, sessions, messages and security headers, through the real ASGI handler."""

from __future__ import annotations

import re

import pytest
from asgiref.sync import async_to_sync
from django.core.checks.security import base as security_checks
from django.core.checks.security import csrf as csrf_checks
from django.http import HttpRequest, HttpResponse
from django.middleware import csrf
from django.test import AsyncClient, RequestFactory, override_settings

from playground.middleware import SAFE_METHODS, CsrfViewMiddleware

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


def _view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ran")


async def _async_get_response(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ran")


@pytest.mark.parametrize("method", [*SAFE_METHODS, "POST"])
def test_our_csrf_view_check_treats_safe_methods_exactly_as_djangos(method: str) -> None:
    # Ours accepts a safe method inline, without Django's private _accept; this fails if
    # Django's own process_view starts to treat a safe method (or an unsafe one) otherwise:
    # a different result, or a different mark left on the request.
    factory = RequestFactory()
    theirs_request, ours_request = factory.generic(method, "/"), factory.generic(method, "/")
    theirs = csrf.CsrfViewMiddleware(lambda request: HttpResponse())
    ours = CsrfViewMiddleware(_async_get_response)
    theirs.process_request(theirs_request)
    ours.process_request(ours_request)

    theirs_result = theirs.process_view(theirs_request, _view, (), {})
    ours_result = async_to_sync(ours.process_view)(ours_request, _view, (), {})

    if method in SAFE_METHODS:
        assert theirs_result is None and ours_result is None
    else:  # no token: both refuse
        assert theirs_result is not None and ours_result is not None
        assert theirs_result.status_code == ours_result.status_code == 403
    assert vars(ours_request).keys() == vars(theirs_request).keys()
    assert getattr(ours_request, "csrf_processing_done", None) == getattr(
        theirs_request, "csrf_processing_done", None
    )
    assert ours_request.META.keys() == theirs_request.META.keys()


def test_safe_methods_pass_and_an_unsafe_one_without_token_is_refused_through_the_chain(  # type: ignore[no-untyped-def]
    alice, org_a, org_b
):
    client = AsyncClient(enforce_csrf_checks=True)
    client.force_login(alice)
    for method in ("get", "head", "options"):
        assert async_to_sync(getattr(client, method))("/").status_code == 200
    refused = async_to_sync(client.post)("/organizations/switch/", {"organization": org_b.pk})
    assert refused.status_code == 403
    assert async_to_sync(client.get)("/").status_code == 200
