"""What a new user meets in the first hour, in real Chromium: the editor (closers typed over,
stdin hint, language menu, plain-text files, folder download), the plan prompts, the billing
page, API key secrets, and what an idle playground page costs."""

from __future__ import annotations

import io
import re
import zipfile

import pytest

from tests.browser.conftest import PASSWORD, login
from tests.requirements import missing_part

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def free_team(transactional_db):  # type: ignore[no-untyped-def]
    """A Free organization: alice owns it, bob is a member."""
    from accounts.models import Membership, Organization, Role, User

    org = Organization.objects.create(name="Free Co", slug="free-co", plan="free")
    alice = User.objects.create_user(email="alice@example.com", password=PASSWORD)
    bob = User.objects.create_user(email="bob@example.com", password=PASSWORD)
    Membership.objects.create(user=alice, organization=org, role=Role.OWNER)
    Membership.objects.create(user=bob, organization=org, role=Role.MEMBER)
    return org


def _csrf(page) -> str:  # type: ignore[no-untyped-def]
    return next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")


def _api(page, method: str, path: str, **kwargs):  # type: ignore[no-untyped-def]
    response = page.request.fetch(
        f"/api/v1/{path}", method=method, headers={"X-CSRFToken": _csrf(page)}, **kwargs
    )
    assert response.ok, response.text()
    return response


def _new_sandbox(page) -> str:  # type: ignore[no-untyped-def]
    return _api(page, "POST", "sandboxes", data={}).json()["id"]


def _open(page, sandbox_id: str) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"/sandboxes/{sandbox_id}/")
    page.wait_for_function("window.sandpit && window.sandpit.editor")


def _executions(page) -> int:  # type: ignore[no-untyped-def]
    return _api(page, "GET", "usage").json()["executions"]


# --- the editor -----------------------------------------------------------------------------


def test_typing_an_fstring_leaves_no_stray_closers(page, org_owner):  # type: ignore[no-untyped-def]
    login(page, org_owner.email)
    _open(page, _new_sandbox(page))
    page.wait_for_function(
        "window.sandpit.terminals.current && window.sandpit.terminals.current.ws"
    )
    page.evaluate("window.sandpit.editor.cm.setValue('')")
    page.click("#editor-host .CodeMirror")
    page.keyboard.type('print(f"Hi {name}")')
    assert page.evaluate("window.sandpit.editor.cm.getValue()") == 'print(f"Hi {name}")'
    page.keyboard.press("Enter")
    page.keyboard.type("xs = [len(s) for s in (a, b)]")
    assert page.evaluate("window.sandpit.editor.cm.getValue()") == (
        'print(f"Hi {name}")\nxs = [len(s) for s in (a, b)]'
    )


def test_input_with_empty_stdin_gets_a_hint(page, org_owner):  # type: ignore[no-untyped-def]
    login(page, org_owner.email)
    _open(page, _new_sandbox(page))
    page.evaluate("window.sandpit.editor.cm.setValue('name = input()\\nprint(name)\\n')")
    page.fill("#stdin", "")
    page.click("#run")
    hint = page.locator("#output .run-hint")
    hint.wait_for()
    assert "stdin box" in hint.inner_text()
    # With input there is no hint.
    page.fill("#stdin", "Ada\n")
    page.click("#run")
    page.locator("#output").get_by_text(re.compile("exit 0")).wait_for()
    assert page.locator("#output .run-hint").count() == 0


def test_language_menu_switches_to_that_languages_scratch(page, org_owner):  # type: ignore[no-untyped-def]
    login(page, org_owner.email)
    _open(page, _new_sandbox(page))
    page.evaluate("window.sandpit.editor.cm.setValue('print(\"from python\")\\n')")
    page.select_option("#language", "node")
    node_code = page.evaluate("window.sandpit.editor.cm.getValue()")
    assert "print(" not in node_code and "console.log" in node_code
    page.click("#run")
    page.locator("#output").get_by_text(re.compile("exit 0")).wait_for()
    page.select_option("#language", "python")
    assert page.evaluate("window.sandpit.editor.cm.getValue()") == 'print("from python")\n'


def test_language_menu_offers_the_sandboxs_compilers(page, org_owner):  # type: ignore[no-untyped-def]
    import shutil

    if shutil.which("gcc") is None:
        missing_part("the local default jail offers C only where the host has gcc")
    login(page, org_owner.email)
    _open(page, _new_sandbox(page))
    # The menu is rebuilt from GET .../languages: the host's gcc makes C one of them.
    page.locator('#language option[value="c"]').wait_for(state="attached")
    assert page.locator('#language option[value="cobol"]').count() == 0
    page.select_option("#language", "c")
    assert "#include <stdio.h>" in page.evaluate("window.sandpit.editor.cm.getValue()")
    page.click("#run")
    page.locator("#output").get_by_text(re.compile("exit 0")).wait_for()
    assert "Hello, world!" in page.inner_text("#output")


def test_opening_a_csv_is_plain_text_not_python(page, org_owner):  # type: ignore[no-untyped-def]
    login(page, org_owner.email)
    sandbox_id = _new_sandbox(page)
    _api(
        page,
        "PUT",
        f"sandboxes/{sandbox_id}/files/content?path=data.csv",
        data=b"a,b\n1,2\n",
    )
    _open(page, sandbox_id)
    page.locator('#tree .node[data-path="data.csv"]').click()
    page.wait_for_function("window.sandpit.editor.path === 'data.csv'")
    assert page.input_value("#language") == "text"
    assert page.evaluate("window.sandpit.editor.cm.getOption('mode')") is None
    page.click("#run")
    page.locator("#output").get_by_text("is not a program").wait_for()
    # Choosing a language from the menu closes the file for that language's scratch file.
    page.once("dialog", lambda d: d.accept())
    page.select_option("#language", "bash")
    page.wait_for_function("window.sandpit.editor.path === null")
    assert "echo" in page.evaluate("window.sandpit.editor.cm.getValue()")


def test_download_of_a_folder_is_a_zip_of_its_files(page, org_owner):  # type: ignore[no-untyped-def]
    login(page, org_owner.email)
    sandbox_id = _new_sandbox(page)
    base = f"sandboxes/{sandbox_id}/files"
    _api(page, "POST", f"{base}/mkdir", data={"path": "proj/sub"})
    _api(page, "PUT", f"{base}/content?path=proj/main.py", data=b"print('hi')\n")
    _api(page, "PUT", f"{base}/content?path=proj/sub/data.bin", data=bytes(range(256)))
    _open(page, sandbox_id)
    page.locator('#tree .node[data-path="proj"]').click()
    with page.expect_download() as info:
        page.click("#download-file")
    download = info.value
    assert download.suggested_filename == "proj.zip"
    archive = zipfile.ZipFile(io.BytesIO(open(download.path(), "rb").read()))  # noqa: SIM115
    assert archive.testzip() is None
    assert sorted(archive.namelist()) == ["proj/main.py", "proj/sub/data.bin"]
    assert archive.read("proj/sub/data.bin") == bytes(range(256))


# --- plans, billing, keys -------------------------------------------------------------------


def test_free_plan_owner_gets_an_upgrade_button_with_the_price(page, free_team):  # type: ignore[no-untyped-def]
    login(page, "alice@example.com")
    _open(page, _new_sandbox(page))
    terminal = page.locator("#terminal-error .plan-notice")
    terminal.wait_for()
    explorer = page.locator("#explorer-notice .plan-notice")
    explorer.wait_for()
    assert "/api/" not in page.locator("main").inner_text()
    messages: list[str] = []

    def dismiss(dialog) -> None:  # type: ignore[no-untyped-def]
        messages.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", dismiss)
    terminal.get_by_role("button", name=re.compile("Upgrade to Premium")).click()
    page.wait_for_function("document.querySelector('#terminal-error .plan-notice') !== null")
    assert messages and "$97.00" in messages[0]
    free_team.refresh_from_db()
    assert free_team.plan == "free"  # dismissed: nothing changed


def test_free_plan_member_is_told_whom_to_ask(page, free_team):  # type: ignore[no-untyped-def]
    login(page, "bob@example.com")
    _open(page, _new_sandbox(page))
    notice = page.locator("#terminal-error .plan-notice")
    notice.wait_for()
    assert "alice@example.com" in notice.inner_text()
    assert notice.get_by_role("button").count() == 0
    assert "/api/" not in page.locator("main").inner_text()


def test_idle_playground_page_costs_a_free_organization_nothing(page, free_team):  # type: ignore[no-untyped-def]
    login(page, "alice@example.com")
    sandbox_id = _new_sandbox(page)
    before = _executions(page)
    _open(page, sandbox_id)
    # Everything the page does by itself: the tree shown, the events socket ready (its watch
    # refused by the plan), the gauges read.
    page.locator("#explorer-notice .plan-notice").wait_for()
    page.wait_for_function("document.getElementById('cpu-text').textContent !== '—'")
    page.wait_for_load_state("networkidle")
    page.reload()
    page.locator("#explorer-notice .plan-notice").wait_for()
    page.wait_for_load_state("networkidle")
    assert _executions(page) == before


def test_billing_page_explains_prices_and_counts_words(page, free_team):  # type: ignore[no-untyped-def]
    login(page, "alice@example.com")
    sandbox_id = _new_sandbox(page)  # one execution, today
    page.goto("/billing/")
    plans = page.locator("#plans")
    assert "An execution is one operation" in plans.inner_text()
    assert "$97.00 a month" in plans.inner_text()
    assert "Terminals" in plans.inner_text()
    page.wait_for_function("document.getElementById('executions').textContent !== '—'")
    # A day of use is not enough to project a month from.
    assert page.inner_text("#projected") == "—"
    assert "3 days of use" in page.inner_text("#projected-exec")
    bar_titles = page.locator("#daily-chart svg rect.bar title").evaluate_all(
        "els => els.map(e => e.textContent)"
    )
    assert any(t.endswith(": 1 execution") for t in bar_titles), bar_titles
    labels = page.locator("#daily-chart svg > text").evaluate_all(
        "els => els.map(e => e.textContent)"
    )
    assert any(re.fullmatch(r"[A-Z][a-z]{2} \d{1,2}", label) for label in labels), labels
    messages: list[str] = []
    page.on("dialog", lambda d: (messages.append(d.message), d.dismiss()))
    page.locator("#plan-actions").get_by_role("button", name=re.compile("Upgrade")).click()
    page.wait_for_function("document.getElementById('plan').textContent === 'free'")
    assert messages and "$97.00" in messages[0] and "100,000" in messages[0]
    del sandbox_id


def test_revoked_keys_secret_leaves_the_screen(page, org_owner):  # type: ignore[no-untyped-def]
    login(page, org_owner.email)
    page.goto("/team/")
    page.fill("#key-name", "throwaway")
    page.click("#key-form button[type=submit]")
    secret = page.locator("#new-secret").inner_text()
    page.once("dialog", lambda d: d.accept())
    page.get_by_role("button", name="Revoke throwaway").click()
    page.locator("#api-keys tr", has_text="throwaway").get_by_text("revoked").wait_for()
    assert secret not in page.content()


def test_team_page_cancels_and_resends_invitations(page, org_owner):  # type: ignore[no-untyped-def]
    login(page, org_owner.email)
    page.goto("/team/")
    page.fill("#invite-email", "friend@example.com")
    page.click("#invite-form button[type=submit]")
    page.locator("#invite-result").get_by_text(
        "Invitation emailed to friend@example.com"
    ).wait_for()
    row = page.locator("#invitations tr", has_text="friend@example.com")
    first_link = page.locator("#invite-result code").inner_text()
    row.get_by_role("button", name="Resend invitation to friend@example.com").click()
    page.locator("#invite-result").get_by_text("sent again").wait_for()
    assert page.locator("#invite-result code").inner_text() != first_link
    page.once("dialog", lambda d: d.accept())
    row.get_by_role("button", name="Cancel invitation to friend@example.com").click()
    row.get_by_text("cancelled").wait_for()
    assert row.get_by_role("button").count() == 0


def test_logged_out_visitor_sees_what_sandpit_is(strict_page, server):  # type: ignore[no-untyped-def]
    strict_page.goto("/")
    assert "/accounts/login" in strict_page.url
    text = strict_page.locator("main").inner_text()
    assert "code sandboxes" in text
    assert strict_page.get_by_role("link", name="Create a free account").is_visible()
    assert strict_page.locator("#id_username").is_visible()
