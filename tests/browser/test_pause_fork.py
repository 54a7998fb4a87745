"""Pause, resume and fork from the playground page, in Chromium against a real daphne: the
state pill says paused, the controls that would run something are off (Destroy stays),
Resume brings them back, and Fork opens the new sandbox's page holding a copy of the files."""

from __future__ import annotations

import tempfile

import pytest

from tests.browser.conftest import login
from tests.browser.test_ui_end_to_end import create_sandbox_from_dashboard

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SERVER_ENV = {"SANDPIT_SNAPSHOT_DIR": tempfile.mkdtemp(prefix="browser-snapshots-")}


def test_pause_resume_and_fork_from_the_playground(page, org_owner, artifacts_dir):  # type: ignore[no-untyped-def]
    from sandboxes.models import Sandbox

    login(page, org_owner.email)
    sandbox_id = create_sandbox_from_dashboard(page)
    page.goto(f"/sandboxes/{sandbox_id}/")
    page.locator("#sandbox-state", has_text="running").wait_for()
    written = page.evaluate(
        """async (id) => {
          const csrf = document.cookie.split("; ").find((c) => c.startsWith("csrftoken=")).split("=")[1];
          const r = await fetch(`/api/v1/sandboxes/${id}/files/content?path=kept.txt`, {
            method: "PUT", body: "copied", credentials: "same-origin",
            headers: {"X-CSRFToken": csrf, "Content-Type": "application/octet-stream"}});
          return r.status;
        }""",
        sandbox_id,
    )
    assert written < 300

    page.click("#pause")
    page.locator("#sandbox-state", has_text="paused").wait_for()
    assert Sandbox.objects.get(pk=sandbox_id).state == "paused"
    assert page.locator("#resume").is_visible() and not page.locator("#pause").is_visible()
    assert page.locator("#run").is_disabled() and page.locator("#new-terminal").is_disabled()
    assert page.locator("#destroy").is_enabled()
    page.screenshot(path=str(artifacts_dir / "playground-paused.png"), full_page=True)

    page.reload()  # a page opened on a paused sandbox shows it the same way
    page.locator("#sandbox-state", has_text="paused").wait_for()
    assert page.locator("#run").is_disabled()
    with page.expect_navigation():  # it reloads to start its live parts
        page.click("#resume")
    page.locator("#sandbox-state", has_text="running").wait_for()
    assert page.locator("#pause").is_visible() and page.locator("#run").is_enabled()

    with page.expect_navigation():
        page.click("#fork")
    page.wait_for_url("**/sandboxes/sbx_*/")
    fork_id = page.url.rstrip("/").rsplit("/", 1)[-1]
    assert fork_id != sandbox_id
    page.locator("#sandbox-state", has_text="running").wait_for()
    page.get_by_text("kept.txt").first.wait_for()
    assert Sandbox.objects.get(pk=fork_id).metadata == {"forked_from": sandbox_id}
    assert not page.js_errors, page.js_errors
