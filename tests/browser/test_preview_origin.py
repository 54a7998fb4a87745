"""Port previews on their own origin, `<port>-<sandbox id>.localhost:<port>` (Chromium resolves
every *.localhost name to loopback), as `make run` serves them."""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import httpx
import pytest

from sandboxes.preview.addresses import host_label
from tests.browser.conftest import login
from tests.browser.test_ui_end_to_end import open_playground

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

INDEX = """<!doctype html>
<title>index</title>
<link rel="icon" href="data:,">
<p id="from-app">not run</p>
<a id="about" href="/about.html">About</a>
<script src="/app.js"></script>
"""
APP = """document.getElementById("from-app").textContent = "app.js ran";
document.cookie = "app=1; path=/";
localStorage.setItem("preview-key", "preview");
"""
ABOUT = '<!doctype html><title>about</title><link rel="icon" href="data:,"><h1>About this app</h1>'


def _api(server: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=server, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def _serving_sandbox(api: httpx.Client) -> str:
    """A sandbox whose port 8000 serves INDEX, APP and ABOUT (listening when this returns)."""
    created = api.post("/api/v1/sandboxes", json={"provider": "local"})
    assert created.status_code == 201, created.text
    sandbox_id = created.json()["id"]
    for name, body in (("index.html", INDEX), ("app.js", APP), ("about.html", ABOUT)):
        wrote = api.put(
            f"/api/v1/sandboxes/{sandbox_id}/files/content",
            params={"path": name},
            content=body,
            headers={"Content-Type": "application/octet-stream"},
        )
        assert wrote.status_code in (200, 201), wrote.text
    started = api.post(
        f"/api/v1/sandboxes/{sandbox_id}/commands",
        json={"command": "exec python3 -m http.server 8000", "background": True},
    )
    assert started.status_code in (200, 201, 202), started.text
    deadline = time.monotonic() + 20
    while not any(
        p["port"] == 8000
        for p in api.get(f"/api/v1/sandboxes/{sandbox_id}/ports").json()["results"]
    ):
        assert time.monotonic() < deadline, "the sandbox's server never listened"
        time.sleep(0.2)
    return sandbox_id


def _preview_host(server: str, sandbox_id: str) -> str:
    return f"http://8000-{host_label(sandbox_id)}.localhost:{urlsplit(server).port}"


def test_preview_on_its_own_origin_serves_absolute_urls(page, server, alice, key_a):  # type: ignore[no-untyped-def]
    api = _api(server, key_a)
    sandbox_id = _serving_sandbox(api)
    preview = _preview_host(server, sandbox_id)
    listed = api.get(f"/api/v1/sandboxes/{sandbox_id}/ports").json()["results"]
    assert [p["url"] for p in listed if p["port"] == 8000] == [preview + "/"]

    login(page, alice.email)
    open_playground(page, sandbox_id)
    link = page.locator('#ports [data-port="8000"] a.port-link')
    link.wait_for(timeout=20000)
    assert link.get_attribute("href") == preview + "/"
    with page.expect_popup() as popup_info:
        link.click()
    tab = popup_info.value
    tab.get_by_text("app.js ran").wait_for()
    # The token was exchanged for the preview's cookie and left the address bar.
    assert tab.url == preview + "/"

    # The page's own subresources, loaded by the viewer's browser with the cookie of a token a
    # member minted, are not counted (as for the path form with the session); documents are.
    def executions() -> int:
        return int(api.get("/api/v1/usage").json()["executions"])

    before = executions()
    tab.evaluate(
        """() => Promise.all([1, 2, 3].map((n) => new Promise((loaded, failed) => {
            const script = document.createElement("script");
            script.src = `/app.js?n=${n}`;
            script.onload = loaded;
            script.onerror = failed;
            document.head.append(script);
        })))"""
    )
    assert executions() == before
    tab.reload()
    tab.get_by_text("app.js ran").wait_for()
    assert executions() == before + 1
    tab.click("#about")
    tab.get_by_role("heading", name="About this app").wait_for()
    assert tab.url == preview + "/about.html"

    # Cookies and storage: the preview's are its own, Sandpit's stay out of its reach.
    preview_cookies = {c["name"]: c for c in page.context.cookies(preview + "/")}
    own = preview_cookies["sandpit_preview"]
    assert own["httpOnly"] and own["sameSite"] == "Lax"
    assert own["domain"] == urlsplit(preview).hostname  # host-only: no sibling sees it
    assert set(preview_cookies) == {"sandpit_preview", "app"}
    assert tab.evaluate("document.cookie") == "app=1"
    sandpit_cookies = {c["name"] for c in page.context.cookies(server + "/")}
    assert "sessionid" in sandpit_cookies and "app" not in sandpit_cookies
    assert page.evaluate("localStorage.getItem('preview-key')") is None
    assert tab.evaluate("localStorage.getItem('preview-key')") == "preview"
    # A preview page cannot read Sandpit's API with the viewer's session.
    outcome = tab.evaluate(
        """(url) => fetch(url, {credentials: "include"}).then(() => "read", () => "blocked")""",
        f"{server}/api/v1/sandboxes",
    )
    assert outcome == "blocked"
    # Its own origin already isolates it: no opaque-origin sandbox needed.
    response = tab.goto(preview + "/app.js")  # Chromium resolves *.localhost; Node would not
    assert response is not None and response.ok
    assert "content-security-policy" not in response.headers
    assert response.headers["cache-control"].startswith("private")
    assert not page.js_errors, page.js_errors


def test_path_form_still_works(page, server, alice, key_a):  # type: ignore[no-untyped-def]
    sandbox_id = _serving_sandbox(_api(server, key_a))
    login(page, alice.email)
    response = page.request.get(f"/sandboxes/{sandbox_id}/ports/8000/app.js")
    assert response.ok and "app.js ran" in response.text()
    assert response.headers["content-security-policy"].startswith("sandbox ")


def test_preview_host_of_another_organizations_sandbox_is_refused(  # type: ignore[no-untyped-def]
    page, server, key_a, key_b
):
    api_a = _api(server, key_a)
    theirs = _serving_sandbox(_api(server, key_b))
    mine = api_a.post("/api/v1/sandboxes", json={"provider": "local"}).json()["id"]
    token = api_a.post(
        f"/api/v1/sandboxes/{mine}/tokens", json={"scopes": ["ports"], "ttl_s": 600}
    ).json()["token"]
    other = _preview_host(server, theirs)

    # In the browser, with a token of this organization: not found, and no cookie set.
    response = page.goto(f"{other}/?token={token}")
    assert response is not None and response.status == 404
    assert response.json()["error"]["code"] == "sandbox_not_found"
    assert page.context.cookies(other + "/") == []
    # An API key of this organization on that host: the same.
    refused = httpx.get(
        f"{server}/", headers={"Host": urlsplit(other).netloc, "Authorization": f"Bearer {key_a}"}
    )
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "sandbox_not_found"
    # Its owner's key is served.
    served = httpx.get(
        f"{server}/", headers={"Host": urlsplit(other).netloc, "Authorization": f"Bearer {key_b}"}
    )
    assert served.status_code == 200 and "app.js" in served.text
