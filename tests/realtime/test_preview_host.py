"""Routing of preview hosts (`<port>-<sandbox id>.<SANDPIT_PREVIEW_DOMAIN>`), in process: which
requests reach the preview proxy, and which WebSocket origins a preview host accepts. What
the browser does with them is tested in Chromium (tests/browser/test_preview_origin.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.testing import HttpCommunicator, WebsocketCommunicator
from django.test import override_settings

pytestmark = pytest.mark.django_db(transaction=True)

DOMAIN = "preview.example.com"
HOST = f"8000-sbx-0123abcd.{DOMAIN}"


@pytest.fixture
def preview_domain(settings):  # type: ignore[no-untyped-def]
    settings.SANDPIT_PREVIEW_DOMAIN = DOMAIN
    settings.ALLOWED_HOSTS = ["sandpit.example.com", f".{DOMAIN}"]
    # A wildcard that also covers the preview domain: it must not open a preview's sockets.
    settings.CSRF_TRUSTED_ORIGINS = ["http://*.example.com"]
    return settings


def _get(path: str, host: str) -> tuple[int, dict[str, Any] | None]:
    async def run() -> tuple[int, dict[str, Any] | None]:
        from playground.asgi import application

        communicator = HttpCommunicator(
            application, "GET", path, headers=[(b"host", host.encode())]
        )
        response = await communicator.get_response(timeout=10)
        body = response["body"]
        is_json = dict(response["headers"]).get(b"content-type") == b"application/json"
        return response["status"], json.loads(body) if is_json else None

    return async_to_sync(run)()


def _handshake(path: str, headers: dict[str, str]) -> bool:
    """Whether the Origin check lets the handshake through (authentication comes after)."""

    async def run() -> bool:
        from playground.asgi import application

        communicator = WebsocketCommunicator(
            application, path, headers=[(k.encode(), v.encode()) for k, v in headers.items()]
        )
        accepted, _ = await communicator.connect(timeout=10)
        await communicator.disconnect()
        return accepted

    return async_to_sync(run)()


def test_every_path_of_a_preview_host_goes_to_the_proxy(preview_domain):  # type: ignore[no-untyped-def]
    for path in ("/", "/admin/", "/api/v1/sandboxes", "/e2b/process.Process/List"):
        status, body = _get(path, HOST)
        assert status == 401 and body is not None, path  # the proxy's answer, not Django's
        assert body["error"]["code"] == "authentication_failed"


def test_a_preview_host_names_its_sandbox_either_way():  # type: ignore[no-untyped-def]
    from sandboxes.preview.addresses import host_label, preview_host_target, preview_url

    with override_settings(SANDPIT_PREVIEW_DOMAIN=DOMAIN, SANDPIT_PREVIEW_SCHEME="https"):
        assert preview_url("sbx_0123abcd", 3000) == f"https://3000-sbx-0123abcd.{DOMAIN}/"
        assert host_label("sbx_0123abcd") == "sbx-0123abcd"
        # Ours (a valid host name), and E2B's get_host (the id as it is).
        assert preview_host_target(f"3000-sbx-0123abcd.{DOMAIN}:443") == ("sbx_0123abcd", 3000)
        assert preview_host_target(f"3000-sbx_0123abcd.{DOMAIN}") == ("sbx_0123abcd", 3000)
        assert preview_host_target("sandpit.example.com") is None


def test_other_names_under_the_preview_domain_are_not_found(preview_domain):  # type: ignore[no-untyped-def]
    for host in (f"www.{DOMAIN}", f"x-sbx_a.{DOMAIN}", f"8000-sbx_a.b.{DOMAIN}"):
        status, body = _get("/", host)
        assert status == 404 and body == {
            "error": {"code": "not_found", "message": "No such preview host."}
        }


def test_the_path_form_can_be_turned_off(preview_domain):  # type: ignore[no-untyped-def]
    path = "/sandboxes/sbx_nosuchsandbox/ports/8000/"
    assert _get(path, "sandpit.example.com")[0] == 401  # the proxy
    preview_domain.SANDPIT_PREVIEW_PATHS = False
    assert _get(path, "sandpit.example.com")[0] == 404  # nothing there
    assert not _handshake(path, {"host": "sandpit.example.com"})


def test_a_preview_hosts_sockets_accept_only_its_own_origin(preview_domain):  # type: ignore[no-untyped-def]
    host = {"host": HOST}
    assert _handshake("/ws", {**host, "origin": f"http://{HOST}"})
    assert _handshake("/ws", host)  # a program: no cookies of Sandpit's go on (asgi.py)
    assert not _handshake("/ws", {**host, "origin": "http://sandpit.example.com"})
    assert not _handshake("/ws", {**host, "origin": f"http://3000-sbx_other.{DOMAIN}"})
    assert not _handshake("/ws", {**host, "origin": f"https://{HOST}"})
    assert not _handshake("/ws", {"host": f"www.{DOMAIN}", "origin": f"http://www.{DOMAIN}"})
    # Sandpit's own host keeps its rules (the trusted wildcard still applies there).
    assert _handshake(
        "/ws/sandboxes/sbx_nosuchsandbox/events",
        {"host": "sandpit.example.com", "origin": "http://other.example.com"},
    )


def test_a_preview_host_does_not_take_the_browser_session(preview_domain, alice, org_a):  # type: ignore[no-untyped-def]
    """Even if a shared cookie domain sent Sandpit's session to a preview host, it would not
    authenticate there (on Sandpit's host the same cookie reaches the tenancy check: 404)."""
    from django.conf import settings
    from django.test import Client

    client = Client()
    client.force_login(alice)
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"

    async def run(host: str, path: str) -> int:
        from playground.asgi import application

        communicator = HttpCommunicator(
            application,
            "GET",
            path,
            headers=[(b"host", host.encode()), (b"cookie", cookie.encode())],
        )
        return int((await communicator.get_response(timeout=10))["status"])

    assert async_to_sync(run)("sandpit.example.com", "/sandboxes/sbx_0123abcd/ports/8000/") == 404
    assert async_to_sync(run)(HOST, "/") == 401
