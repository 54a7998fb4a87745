"""The port preview serves sandbox content on Sandpit's origin: what a sandbox's responses and
other sites' pages must not be able to do to the viewer. Where the browser decides (cookies,
Clear-Site-Data, SameSite), the test drives real Chromium."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.test import Client

from accounts.models import Membership

from .conftest import Api

pytestmark = pytest.mark.django_db(transaction=True)

CHROMIUM = "/usr/bin/chromium"

# The app inside the sandbox (standard library only): every hostile header at /hostile,
# a side effect on POST /hit (counted in hits.txt), the count at /hits.
HOSTILE_APP = r"""
import http.server, os

class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, body, extra=()):
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        for name, value in extra:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/hostile":
            self.reply(b"<p>hostile</p>", [
                ("Clear-Site-Data", '"cookies", "storage", "cache"'),
                ("Strict-Transport-Security", "max-age=63072000; includeSubDomains"),
                ("Alt-Svc", 'h2="evil.example:443"'),
                ("Service-Worker-Allowed", "/"),
                ("Set-Login", "logged-out"),
                ("Origin-Agent-Cluster", "?0"),
                ("NEL", '{"report_to": "x", "max_age": 86400}'),
                ("Report-To", '{"group": "x", "max_age": 86400, "endpoints": []}'),
                ("Accept-CH", "Sec-CH-UA-Model"),
                ("CDN-Cache-Control", "public, max-age=31536000"),
                ("Surrogate-Control", "max-age=31536000"),
                ("Cache-Control", "public, max-age=31536000"),
                ("Set-Cookie", "sandpit_preview=forged; Path=/"),
                ("Set-Cookie", "sessionid=forged; Path=/"),
                ("Set-Cookie", "csrftoken=forged; Path=/"),
                ("Set-Cookie", "app=kept; Path=/"),
            ])
        elif self.path == "/hits":
            hits = os.path.getsize("hits.txt") if os.path.exists("hits.txt") else 0
            self.reply(str(hits).encode())
        else:
            self.reply(b"<p>preview-page</p>", [("Cache-Control", "no-store")])

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with open("hits.txt", "a") as hits:
            hits.write("x")
        self.reply(b"hit")

http.server.ThreadingHTTPServer(("0.0.0.0", 8000), Handler).serve_forever()
"""


def _start_app(api: Api, sandbox_id: str) -> str:
    put = api.put(
        f"/api/v1/sandboxes/{sandbox_id}/files/content",
        params={"path": "hostile.py"},
        content=HOSTILE_APP.encode(),
    )
    assert put.status_code in (200, 201, 204), put.text
    started = api.post(
        f"/api/v1/sandboxes/{sandbox_id}/processes",
        json={"command": "python3", "args": ["hostile.py"]},
    )
    assert started.status_code in (200, 201), started.text
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        ports = api.get(f"/api/v1/sandboxes/{sandbox_id}/ports").json()["results"]
        if any(p["port"] == 8000 for p in ports):
            return f"/sandboxes/{sandbox_id}/ports/8000"
        time.sleep(0.2)
    raise AssertionError("the app in the sandbox never listened")


def _hits(api: Api, prefix: str) -> int:
    return int(api.get(prefix + "/hits").text)


def _executions(api: Api) -> int:
    return int(api.get("/api/v1/usage").json()["executions"])


def _session_cookie(user: Any) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def _signed_in(context: Any, server: Any, user: Any) -> str:
    """Put a session of `user` in the browser, as Django's login sets it (SameSite=Lax)."""
    session = _session_cookie(user)
    context.add_cookies(
        [
            {
                "name": "sessionid",
                "value": session,
                "url": server.http,
                "httpOnly": True,
                "sameSite": "Lax",
            }
        ]
    )
    return session


@pytest.fixture(scope="module")
def _allow_orm_beside_playwright() -> Iterator[None]:
    # Playwright's sync API runs an event loop in this thread; the fixtures' ORM calls are
    # still plain synchronous code.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        yield


@pytest.fixture(scope="module")
def chromium(_allow_orm_beside_playwright: None) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        yield browser
        browser.close()


@pytest.fixture
def app_a(rt_api_a: Api, sbx_a: str) -> str:
    return _start_app(rt_api_a, sbx_a)


class _AttackerSite:
    """A page of another origin: /attack.html holds a form POSTing to `target`."""

    def __init__(self, target: str) -> None:
        page = (
            f'<form id="f" method="post" action="{target}"><input name="a" value="b"></form>'
            "<script>document.getElementById('f').submit()</script>"
        ).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _attack(page: Any, attacker_origin: str, target: str) -> int:
    """Open the attacker's page; the status of the preview's answer to its form POST."""
    with page.expect_response(lambda r: r.url == target) as answer:
        page.goto(f"{attacker_origin}/attack.html")
    return int(answer.value.status)


# --- headers from the sandbox ---------------------------------------------------------------


def test_origin_wide_headers_own_cookies_and_shared_caching_are_dropped(rt_api_a, app_a):  # type: ignore[no-untyped-def]
    response = rt_api_a.get(app_a + "/hostile")
    assert response.status_code == 200 and "hostile" in response.text
    for name in (
        "clear-site-data",
        "strict-transport-security",
        "alt-svc",
        "service-worker-allowed",
        "set-login",
        "origin-agent-cluster",
        "nel",
        "report-to",
        "accept-ch",
        "cdn-cache-control",
        "surrogate-control",
    ):
        assert name not in response.headers, name
    cookies = response.headers.get_list("set-cookie")
    assert cookies == [f"app=kept; Path={app_a}/"]
    assert response.headers["cache-control"] == "private, no-cache"
    assert "sandbox" in response.headers["content-security-policy"]
    # The sandbox's own no-store stays no-store; Sandpit's own refusals are not cached either.
    assert rt_api_a.get(app_a + "/").headers["cache-control"] == "private, no-store"
    refused = httpx.get(rt_api_a.server.http + app_a + "/")
    assert refused.status_code == 401 and refused.headers["cache-control"] == "no-store"


def test_clear_site_data_from_a_preview_does_not_log_the_viewer_out(  # type: ignore[no-untyped-def]
    chromium, server, alice, app_a
):
    context = chromium.new_context(base_url=server.http)
    _signed_in(context, server, alice)
    page = context.new_page()
    assert page.goto(app_a + "/hostile").status == 200
    page.get_by_text("hostile").wait_for()
    names = {c["name"] for c in context.cookies()}
    assert "sessionid" in names
    # Still signed in: the preview (session only) still answers, and so does the dashboard.
    assert page.goto(app_a + "/").status == 200
    page.goto("/")
    assert "/accounts/login" not in page.url
    context.close()


# --- cookies and other sites ----------------------------------------------------------------


def test_other_sites_cannot_post_to_a_preview_the_viewer_visited(  # type: ignore[no-untyped-def]
    chromium, server, rt_api_a, alice, sbx_a, app_a
):
    token = rt_api_a.post(f"/api/v1/sandboxes/{sbx_a}/tokens", json={"scopes": ["ports"]}).json()[
        "token"
    ]
    context = chromium.new_context(base_url=server.http)
    _signed_in(context, server, alice)
    page = context.new_page()
    # The victim opens the preview with a token (it becomes the preview cookie) and is
    # signed in to Sandpit as well: both cookies are in the browser.
    assert page.goto(f"{app_a}/?token={token}").status == 200
    target = f"{server.http}{app_a}/hit"

    # Another site (localhost is not 127.0.0.1's site): the browser sends no cookie at all.
    cross_site = _AttackerSite(target)
    try:
        assert _attack(page, f"http://localhost:{cross_site.port}", target) == 401
    finally:
        cross_site.close()
    # Another origin on the same site (another port): the Lax cookies go along, and the
    # proxy refuses the unsafe method from a foreign origin.
    same_site = _AttackerSite(target)
    try:
        assert _attack(page, f"http://127.0.0.1:{same_site.port}", target) == 403
    finally:
        same_site.close()
    assert _hits(rt_api_a, app_a) == 0

    # Sandpit's own pages may still post to the preview with the viewer's credentials.
    page.goto("/health/live")
    with page.expect_response(lambda r: r.url == target) as answer:
        page.evaluate(
            """target => {
                const form = document.createElement('form');
                form.method = 'post'; form.action = target;
                document.body.appendChild(form); form.submit();
            }""",
            target,
        )
    assert answer.value.status == 200
    assert _hits(rt_api_a, app_a) == 1
    preview_cookie = next(c for c in context.cookies() if c["name"] == "sandpit_preview")
    assert preview_cookie["sameSite"] == "Lax"
    context.close()


def test_preview_access_ends_with_logout_and_with_membership(  # type: ignore[no-untyped-def]
    chromium, server, bob, org_a, app_a
):
    from django.contrib.sessions.backends.db import SessionStore

    context = chromium.new_context(base_url=server.http)
    session = _signed_in(context, server, bob)
    page = context.new_page()
    assert page.goto(app_a + "/").status == 200
    SessionStore(session_key=session).delete()  # what logging out does to the session
    assert page.goto(app_a + "/").status == 401

    _signed_in(context, server, bob)
    assert page.goto(app_a + "/").status == 200
    Membership.objects.filter(user=bob, organization=org_a).delete()
    assert page.goto(app_a + "/").status in (401, 404)
    context.close()


# --- metering ---------------------------------------------------------------------------------


def test_keys_pay_for_every_preview_request_whatever_sec_fetch_says(  # type: ignore[no-untyped-def]
    server, rt_api_a, alice, app_a
):
    # A preview request is counted before its answer is sent, so no waiting is needed.
    before = _executions(rt_api_a)
    for dest in ("image", "script", "style"):
        response = rt_api_a.get(
            app_a + "/", headers={"Sec-Fetch-Dest": dest, "Sec-Fetch-Site": "same-origin"}
        )
        assert response.status_code == 200
    assert _executions(rt_api_a) == before + 3

    # A member's browser session: same-origin subresources are the documented exemption;
    # documents, and anything another site asks for, are counted.
    browser = httpx.Client(
        base_url=server.http, cookies={"sessionid": _session_cookie(alice)}, timeout=10
    )
    subresource = {"Sec-Fetch-Dest": "image", "Sec-Fetch-Site": "same-origin"}
    assert browser.get(app_a + "/", headers=subresource).status_code == 200
    assert _executions(rt_api_a) == before + 3
    assert browser.get(app_a + "/", headers={"Sec-Fetch-Dest": "document"}).status_code == 200
    assert _executions(rt_api_a) == before + 4
