"""The browser UI end to end: a real daphne, the local provider, headless Chromium."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.browser.conftest import PASSWORD, login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def create_sandbox_from_dashboard(page) -> str:  # type: ignore[no-untyped-def]
    page.goto("/")
    page.wait_for_selector("#provider option[value=local]", state="attached")
    page.click("#create-form button[type=submit]")
    link = page.locator("#open-new")
    link.wait_for()
    sandbox_id = re.search(r"sbx_[0-9a-f]+", link.get_attribute("href")).group(0)
    page.locator(f"#sandbox-list tr[data-id={sandbox_id}]").wait_for()
    return sandbox_id


def open_playground(page, sandbox_id: str) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"/sandboxes/{sandbox_id}/")
    page.wait_for_function("window.sandpit && window.sandpit.editor")


def terminal_text(page) -> str:  # type: ignore[no-untyped-def]
    return page.evaluate(
        """() => {
            const t = window.sandpit.terminals.current;
            if (!t) return "";
            const buf = t.term.buffer.active;
            let out = [];
            for (let i = 0; i < buf.length; i++) out.push(buf.getLine(i).translateToString(true));
            return out.join("\\n");
        }"""
    )


def type_in_terminal(page, text: str) -> None:  # type: ignore[no-untyped-def]
    page.wait_for_function(
        "window.sandpit.terminals.current && window.sandpit.terminals.current.ws"
        " && window.sandpit.terminals.current.ws.readyState === 1"
    )
    page.locator(".term-host:not([hidden]) .xterm").click()
    page.keyboard.type(text)
    page.keyboard.press("Enter")


def wait_terminal_line(page, pattern: str, timeout_ms: int = 10000) -> None:  # type: ignore[no-untyped-def]
    page.wait_for_function(
        """(p) => {
            const t = window.sandpit.terminals.current;
            if (!t) return false;
            const buf = t.term.buffer.active;
            for (let i = 0; i < buf.length; i++) {
                if (new RegExp(p, "m").test(buf.getLine(i).translateToString(true))) return true;
            }
            return false;
        }""",
        arg=pattern,
        timeout=timeout_ms,
    )


def test_log_in_create_sandbox_and_use_the_terminal(page, org_owner, artifacts_dir):  # type: ignore[no-untyped-def]
    login(page, org_owner.email)
    assert page.locator("h1").inner_text().startswith("Sandboxes")
    sandbox_id = create_sandbox_from_dashboard(page)
    page.screenshot(path=str(artifacts_dir / "dashboard.png"), full_page=True)

    page.click(f"#sandbox-list tr[data-id={sandbox_id}] a.open-link")
    page.wait_for_url(f"**/sandboxes/{sandbox_id}/")
    page.wait_for_function("window.sandpit && window.sandpit.terminals.items.length > 0")
    type_in_terminal(page, "echo hi")
    wait_terminal_line(page, r"^hi\s*$")

    # Reload: the terminal is reattached, its scrollback replayed.
    page.reload()
    page.wait_for_function("window.sandpit && window.sandpit.terminals.items.length === 1")
    wait_terminal_line(page, r"^hi\s*$")
    assert not page.js_errors, page.js_errors


def test_run_code_files_upload_download(page, org_owner, artifacts_dir, tmp_path):  # type: ignore[no-untyped-def]
    login(page, org_owner.email)
    sandbox_id = create_sandbox_from_dashboard(page)
    open_playground(page, sandbox_id)

    # Run a Python snippet from the editor, with stdin.
    page.select_option("#language", "python")
    page.evaluate(
        "window.sandpit.editor.cm.setValue("
        '\'import sys\\nprint("sum", sum(range(10)))\\nprint("hello", sys.stdin.read().strip())\\n\')'
    )
    page.fill("#stdin", "sandpit")
    page.click("#run")
    output = page.locator("#output")
    output.get_by_text("sum 45").wait_for()
    output.get_by_text("hello sandpit").wait_for()
    output.get_by_text(re.compile(r"exit 0")).wait_for()

    # A file created in the terminal appears in the explorer (file events).
    page.wait_for_selector("#tree ul.tree")
    type_in_terminal(page, "echo 'print(123)' > from_terminal.py")
    page.locator('#tree [data-path="from_terminal.py"]').wait_for(timeout=10000)

    # Open it in the editor, edit, save with Ctrl-S.
    page.click('#tree [data-path="from_terminal.py"]')
    page.wait_for_function("window.sandpit.editor.path === 'from_terminal.py'")
    page.evaluate("window.sandpit.editor.cm.setValue('print(456)\\n')")
    page.locator(".CodeMirror textarea").focus()
    page.keyboard.press("Control+s")
    page.wait_for_function("!window.sandpit.editor.dirty")
    type_in_terminal(page, "cat from_terminal.py")
    wait_terminal_line(page, r"^print\(456\)")

    # Upload by drag and drop onto the explorer.
    page.evaluate(
        """() => {
            const dt = new DataTransfer();
            dt.items.add(new File(["uploaded bytes\\n"], "dropped.txt", {type: "text/plain"}));
            const pane = document.getElementById("explorer-pane");
            for (const type of ["dragenter", "dragover", "drop"]) {
                pane.dispatchEvent(new DragEvent(type, {dataTransfer: dt, bubbles: true, cancelable: true}));
            }
        }"""
    )
    node = page.locator('#tree [data-path="dropped.txt"]')
    node.wait_for()
    page.screenshot(path=str(artifacts_dir / "playground.png"))
    page.emulate_media(color_scheme="dark")
    page.screenshot(path=str(artifacts_dir / "playground-dark.png"))
    page.emulate_media(color_scheme="light")

    # Download it back.
    node.click()
    with page.expect_download() as info:
        page.click("#download-file")
    target = tmp_path / "dropped.txt"
    info.value.save_as(target)
    assert Path(target).read_text() == "uploaded bytes\n"
    assert not page.js_errors, page.js_errors


def test_port_preview(page, org_owner, artifacts_dir):  # type: ignore[no-untyped-def]
    login(page, org_owner.email)
    sandbox_id = create_sandbox_from_dashboard(page)
    open_playground(page, sandbox_id)
    type_in_terminal(page, "echo preview-ok > index.txt && python3 -m http.server 8000")
    link = page.locator('#ports [data-port="8000"] a.port-link')
    link.wait_for(timeout=20000)
    # On its own origin (tests/browser/test_preview_origin.py), opened in a new tab.
    port = page.url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1]
    label = sandbox_id.replace("_", "-")
    assert link.get_attribute("href") == f"http://8000-{label}.localhost:{port}/"
    with page.expect_popup() as popup:
        link.click()
    popup.value.get_by_text("index.txt").wait_for(timeout=10000)
    popup.value.screenshot(path=str(artifacts_dir / "port-preview.png"))
    popup.value.close()

    # Destroyed elsewhere (another tab, the API, the reaper): the page says so clearly.
    csrf = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    response = page.request.delete(f"/api/v1/sandboxes/{sandbox_id}", headers={"X-CSRFToken": csrf})
    assert response.ok, response.text()
    page.locator(".gone-banner").get_by_text("destroyed").wait_for(timeout=15000)
    page.screenshot(path=str(artifacts_dir / "playground-destroyed.png"))


def test_api_keys_and_billing_usage(page, org_owner, artifacts_dir):  # type: ignore[no-untyped-def]
    login(page, org_owner.email)
    page.goto("/billing/")
    page.wait_for_function("document.getElementById('executions').textContent !== '—'")
    before = int(page.inner_text("#executions").replace(",", ""))

    # Create an API key: the secret is shown once, with a copy button.
    page.goto("/team/")
    page.fill("#key-name", "ci runner")
    page.click("#key-form button[type=submit]")
    secret = page.locator("#new-secret").inner_text()
    assert secret.startswith("sk_") or len(secret) > 20
    assert page.locator("#copy-secret").is_visible()
    row = page.locator("#api-keys tr", has_text="ci runner")
    row.get_by_text("active").wait_for()
    page.screenshot(path=str(artifacts_dir / "team.png"), full_page=True)
    page.reload()
    assert page.locator("#new-secret").count() == 0  # never shown again
    page.once("dialog", lambda d: d.accept())
    page.locator("#api-keys tr", has_text="ci runner").get_by_role(
        "button", name="Revoke ci runner"
    ).click()
    page.locator("#api-keys tr", has_text="ci runner").get_by_text("revoked").wait_for()

    # Metered actions: a sandbox and a run.
    sandbox_id = create_sandbox_from_dashboard(page)
    open_playground(page, sandbox_id)
    page.evaluate("window.sandpit.editor.cm.setValue('print(1)\\n')")
    page.select_option("#language", "python")
    page.click("#run")
    page.locator("#output").get_by_text(re.compile("exit 0")).wait_for()

    page.goto("/billing/")
    page.wait_for_function("document.getElementById('executions').textContent !== '—'")
    after = int(page.inner_text("#executions").replace(",", ""))
    assert after >= before + 2, (before, after)
    page.locator("#daily-chart svg rect.bar").first.wait_for(state="attached")
    page.screenshot(path=str(artifacts_dir / "billing.png"), full_page=True)
    assert not page.js_errors, page.js_errors


def test_staff_dashboard_is_for_staff_only(page, org_owner, artifacts_dir):  # type: ignore[no-untyped-def]
    from accounts.models import User

    login(page, org_owner.email)
    sandbox_id = create_sandbox_from_dashboard(page)
    response = page.goto("/staff/")
    assert response.status == 403
    assert page.locator("nav.mainnav").get_by_text("Staff").count() == 0
    page.context.clear_cookies()

    User.objects.create_user(email="ops@example.com", password=PASSWORD, is_staff=True)
    login(page, "ops@example.com")
    response = page.goto("/staff/")
    assert response.status == 200
    row = page.locator(f"tr[data-id={sandbox_id}]")
    row.get_by_text("Acme Labs").wait_for()
    page.locator("#hours-chart svg").wait_for()
    page.screenshot(path=str(artifacts_dir / "staff.png"), full_page=True)
    page.once("dialog", lambda d: d.accept())
    row.get_by_role("button", name=f"Kill {sandbox_id}").click()
    row.get_by_text("killed").wait_for()

    from sandboxes.models import Sandbox

    sandbox = Sandbox.objects.get(pk=sandbox_id)
    assert sandbox.state == "destroyed"
    assert sandbox.destroy_reason == "staff"
