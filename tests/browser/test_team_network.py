"""The Team page's network switch and docker runtime select, in Chromium against a real
daphne: an owner changes them for the organization, and a member only sees the settings."""

from __future__ import annotations

import pytest

from tests.browser.conftest import PASSWORD, login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_owner_turns_network_on_from_the_team_page(page, org_owner, artifacts_dir):  # type: ignore[no-untyped-def]
    from accounts.models import Organization

    login(page, org_owner.email)
    page.goto("/team/")
    toggle = page.locator("#network-toggle")
    assert not toggle.is_checked()
    toggle.check()
    page.get_by_text("Outbound network allowed for new sandboxes.").wait_for()
    assert Organization.objects.get(slug="acme").allow_network is True
    page.screenshot(path=str(artifacts_dir / "team-network.png"), full_page=True)
    page.reload()
    assert page.locator("#network-toggle").is_checked()
    assert not page.js_errors, page.js_errors


def test_a_member_sees_the_setting_without_the_switch(page, org_owner):  # type: ignore[no-untyped-def]
    from accounts.models import Membership, Organization, Role, User

    member = User.objects.create_user(email="bob@example.com", password=PASSWORD)
    Membership.objects.create(
        user=member, organization=Organization.objects.get(slug="acme"), role=Role.ADMIN
    )
    login(page, member.email)
    page.goto("/team/")
    page.get_by_text("Ask an owner to allow it here.").wait_for()
    assert page.locator("#network-toggle").count() == 0


def test_owner_picks_the_docker_runtime_from_the_team_page(page, org_owner):  # type: ignore[no-untyped-def]
    from accounts.models import Organization

    login(page, org_owner.email)
    page.goto("/team/")
    select = page.locator("#runtime-select")
    assert select.input_value() == ""
    select.select_option("runc")
    page.get_by_text("New docker sandboxes run as plain containers.").wait_for()
    assert Organization.objects.get(slug="acme").docker_runtime == "runc"
    # This server enables only the local provider: requiring gVisor is refused with the
    # reason shown, and the select goes back to what is saved.
    select.select_option("runsc")
    page.locator("#runtime-result").get_by_text("SANDPIT_PROVIDERS").wait_for()
    assert select.input_value() == "runc"
    assert Organization.objects.get(slug="acme").docker_runtime == "runc"
    page.reload()
    assert page.locator("#runtime-select").input_value() == "runc"
    assert not page.js_errors, page.js_errors


def test_a_member_sees_the_runtime_without_the_select(page, org_owner):  # type: ignore[no-untyped-def]
    from accounts.models import Membership, Organization, Role, User

    acme = Organization.objects.get(slug="acme")
    Organization.objects.filter(pk=acme.pk).update(docker_runtime="runsc")
    member = User.objects.create_user(email="bob@example.com", password=PASSWORD)
    Membership.objects.create(user=member, organization=acme, role=Role.MEMBER)
    login(page, member.email)
    page.goto("/team/")
    page.locator("#runtime-state").get_by_text("gVisor (required)").wait_for()
    assert page.locator("#runtime-select").count() == 0
