"""The Templates page in Chromium against a real daphne: an owner builds a template from a
Dockerfile, watches the progress bar and the live log to the end, finds it in the
dashboard's template menu, and deletes it (its image goes with it)."""

from __future__ import annotations

import subprocess

import pytest

from tests.browser.conftest import login
from tests.docker_support import docker_provider_or_skip
from tests.requirements import JAIL_ROOTS

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SERVER_ENV = {
    "SANDPIT_TEMPLATE_BUILDER": "thread",
    # made by the build (passable: JAIL_ROOTS is o+x); the template's deletion empties it
    "SANDPIT_TEMPLATE_ROOT": str(JAIL_ROOTS / "browser-templates"),
}


def test_owner_builds_follows_uses_and_deletes_a_template(page, org_owner, artifacts_dir):  # type: ignore[no-untyped-def]
    from sandboxes.models import Template

    docker_provider_or_skip()
    login(page, org_owner.email)
    page.goto("/templates/")
    page.get_by_text("No templates yet.").wait_for()
    page.fill("#tpl-name", "hello")
    page.fill("#tpl-dockerfile", "FROM sandpit\nRUN echo hello > /tmp/hello\n")
    page.click("#tpl-form button[type=submit]")
    page.locator("#tpl-build").wait_for()
    page.wait_for_function(
        "document.querySelector('#tpl-progress').getAttribute('aria-valuenow') === '100'",
        timeout=180_000,
    )
    page.wait_for_function(
        "document.querySelector('#tpl-log').textContent.includes('==> ready')", timeout=30_000
    )
    log = page.locator("#tpl-log").inner_text()
    assert "Step 1/2 : FROM sandpit-sandbox" in log, log
    assert "ready" in page.locator("#tpl-build-status").inner_text()
    page.screenshot(path=str(artifacts_dir / "templates-built.png"), full_page=True)
    image = Template.objects.get(name="hello").image

    page.goto("/")
    page.wait_for_function(
        "[...document.querySelectorAll('#template option')].some(o => o.value === 'hello')"
    )

    page.goto("/templates/")
    page.on("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Delete hello").click()
    page.get_by_text("No templates yet.").wait_for()
    assert not Template.objects.filter(name="hello").exists()
    inspect = subprocess.run(["docker", "image", "inspect", image], capture_output=True)
    assert inspect.returncode != 0, image
    assert not page.js_errors, page.js_errors
