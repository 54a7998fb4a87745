"""Content-Security-Policy: every page sends one, the pages run under it without a single
violation in real Chromium, and the API docs load Swagger UI from our own static files."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import pytest

from tests.browser.conftest import login
from tests.browser.test_ui_end_to_end import create_sandbox_from_dashboard

# Filled in by an init script, which runs before the page's own scripts and outside its CSP.
_RECORD_VIOLATIONS = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__csp.push(`${e.effectiveDirective} blocked ${e.blockedURI || "inline"} at ${e.sourceFile}:${e.lineNumber}`);
});
"""


def _watch(page):  # type: ignore[no-untyped-def]
    """Record CSP reports from the console and requests that leave the app's origin."""
    console: list[str] = []
    foreign: list[str] = []
    page.add_init_script(_RECORD_VIOLATIONS)
    page.on(
        "console",
        lambda msg: console.append(msg.text) if "Content Security Policy" in msg.text else None,
    )
    page.on("request", lambda req: foreign.append(req.url))
    return console, foreign


def _violations(page, console: list[str]) -> list[str]:  # type: ignore[no-untyped-def]
    return [*console, *page.evaluate("window.__csp || []")]


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_main_pages_run_under_the_csp_without_violations(strict_page, server, org_owner):  # type: ignore[no-untyped-def]
    page = strict_page
    console, requests = _watch(page)
    login(page, org_owner.email)
    sandbox_id = create_sandbox_from_dashboard(page)
    checked = []

    def visit(path: str, ready) -> None:  # type: ignore[no-untyped-def]
        response = page.goto(path)
        assert response is not None and response.ok, path
        policy = response.headers.get("content-security-policy", "")
        assert (
            "script-src 'self'" in policy
            and "unsafe-inline" not in policy.split("script-src")[1].split(";")[0]
        ), policy
        ready()
        checked.append(path)
        assert _violations(page, console) == [], (path, _violations(page, console))

    visit("/", lambda: page.wait_for_selector(f"#sandbox-list tr[data-id={sandbox_id}]"))
    # The editor (CodeMirror) and a terminal (xterm.js, connected over its WebSocket) are
    # running, not just loaded; waits are selectors, since wait_for_function would need eval.
    visit(
        f"/sandboxes/{sandbox_id}/",
        lambda: [
            page.wait_for_selector(".CodeMirror"),
            page.wait_for_selector(".term-host:not([hidden]) .xterm-rows > div"),
        ],
    )
    visit("/team/", lambda: page.wait_for_selector("main h1"))
    visit("/billing/", lambda: page.wait_for_selector("main h1"))
    visit("/api/docs/", lambda: page.wait_for_selector(".swagger-ui .information-container"))
    assert checked == ["/", f"/sandboxes/{sandbox_id}/", "/team/", "/billing/", "/api/docs/"]
    assert not page.js_errors, page.js_errors
    outside = [url for url in requests if not url.startswith((server, "data:", "blob:"))]
    assert outside == []


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_api_docs_render_swagger_ui_from_local_static_files(strict_page, server, org_owner):  # type: ignore[no-untyped-def]
    page = strict_page
    login(page, org_owner.email)
    # Offline: anything not served by the app fails, as it would without internet access.
    page.context.route(
        re.compile(r"^(?!" + re.escape(server) + r")https?://.*"), lambda route: route.abort()
    )
    loaded: list[str] = []
    page.on("requestfinished", lambda req: loaded.append(urlsplit(req.url).path))
    page.goto("/api/docs/")
    page.wait_for_selector(".swagger-ui .info .title")
    assert "Sandpit API" in page.locator(".swagger-ui .info .title").inner_text()
    # The operations come from our schema.
    page.wait_for_selector(".opblock-tag-section")
    assert any(p.endswith("/swagger-ui-dist/swagger-ui-bundle.js") for p in loaded), loaded
    assert all(
        p.startswith("/static/drf_spectacular_sidecar/")
        for p in loaded
        if p.endswith((".js", ".css")) and "swagger" in p
    ), loaded
    assert not page.js_errors, page.js_errors
