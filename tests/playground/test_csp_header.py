"""Every page sends the Content-Security-Policy and carries no inline script or event handler
(the browser side is tests/browser/test_csp.py); responses with a policy of their own keep it."""

from __future__ import annotations

import re

import pytest
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.test import Client

from accounts.models import Membership, Organization, Role, User
from playground.csp import ContentSecurityPolicyMiddleware

_INLINE_SCRIPT = re.compile(r"<script(?![^>]*\bsrc=)(?![^>]*application/json)[^>]*>", re.I)
_INLINE_HANDLER = re.compile(r"<[^>]+\son[a-z]+\s*=", re.I)


@pytest.mark.django_db
def test_pages_send_the_csp_and_carry_no_inline_script(alice: User, org_a: Organization) -> None:
    org_owner = alice
    # A second organization makes the top bar show its organization picker.
    extra = Organization.objects.create(name="Other", slug="other")
    Membership.objects.create(user=org_owner, organization=extra, role=Role.MEMBER)
    anonymous = Client()
    for path in ("/accounts/login/", "/accounts/signup/", "/accounts/password_reset/"):
        response = anonymous.get(path)
        assert response["Content-Security-Policy"] == settings.CONTENT_SECURITY_POLICY, path
    client = Client()
    client.force_login(org_owner)
    for path in ("/", "/team/", "/billing/", "/api/docs/", "/does-not-exist/"):
        response = client.get(path)
        assert response["Content-Security-Policy"] == settings.CONTENT_SECURITY_POLICY, path
        html = response.content.decode()
        assert not _INLINE_SCRIPT.search(html), (path, _INLINE_SCRIPT.search(html))
        assert not _INLINE_HANDLER.search(html), (path, _INLINE_HANDLER.search(html))
    assert "swagger-ui-bundle.js" in client.get("/api/docs/").content.decode()
    assert "cdn" not in client.get("/api/docs/").content.decode().lower()


def test_a_response_with_its_own_policy_keeps_it() -> None:
    """The port-preview proxy answers with `Content-Security-Policy: sandbox ...`; ours must not
    replace it."""
    own = "sandbox allow-scripts"

    def preview(request: HttpRequest) -> HttpResponse:
        response = HttpResponse("sandbox page")
        response["Content-Security-Policy"] = own
        return response

    response = ContentSecurityPolicyMiddleware(preview)(HttpRequest())
    assert response["Content-Security-Policy"] == own
    plain = ContentSecurityPolicyMiddleware(lambda request: HttpResponse("page"))(HttpRequest())
    assert plain["Content-Security-Policy"] == settings.CONTENT_SECURITY_POLICY
