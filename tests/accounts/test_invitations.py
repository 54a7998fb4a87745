"""Invitations that work like everyone else's: mailed, cancelled and resent by managers (API
and page), and carried through sign-up so the new account joins the inviting organization."""

from __future__ import annotations

import re

import pytest
from django.core import mail
from django.test import Client

from accounts.models import Invitation, Membership, Organization, Role, User
from accounts.services import invitation_create
from tests.conftest import assert_error

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _mailbox(settings):  # type: ignore[no-untyped-def]
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"


def _manager(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _invite(client: Client, email: str, role: str = "member"):  # type: ignore[no-untyped-def]
    return client.post(
        "/api/v1/invitations", {"email": email, "role": role}, content_type="application/json"
    )


def _mailed_path(index: int = -1) -> str:
    match = re.search(r"https?://[^/\s]+(/invitations/[^/\s]+/)", mail.outbox[index].body)
    assert match, mail.outbox[index].body
    return match.group(1)


def test_invitation_is_mailed_to_the_invited_address(org_a, alice):
    created = _invite(_manager(alice), "New@Example.com", "admin")
    assert created.status_code == 201
    body = created.json()
    assert body["emailed"] is True
    [message] = mail.outbox
    assert message.to == ["new@example.com"]
    assert "Org A" in message.subject and "alice@example.com" in message.subject
    assert "as admin" in message.body
    assert body["url"].endswith(_mailed_path())


def test_a_failing_mail_server_still_leaves_a_shareable_link(org_a, alice, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", 9, 2
    created = _invite(_manager(alice), "new@example.com")
    assert created.status_code == 201
    assert created.json()["emailed"] is False
    assert "/invitations/" in created.json()["url"]


def test_manager_cancels_a_pending_invitation(org_a, alice, charlie):
    client = _manager(alice)
    body = _invite(client, "charlie@example.com").json()
    path = _mailed_path()
    assert client.delete(f"/api/v1/invitations/{body['id']}").status_code == 204
    assert Invitation.objects.get(pk=body["id"]).revoked_at is not None
    listed = client.get("/api/v1/invitations").json()["results"]
    assert listed[0]["revoked_at"] is not None
    invitee = _manager(charlie)
    assert invitee.post(path).status_code == 409
    assert not Membership.objects.filter(user=charlie, organization=org_a).exists()


def test_resend_mails_a_new_link_and_ends_the_old_one(org_a, alice, charlie):
    client = _manager(alice)
    body = _invite(client, "charlie@example.com").json()
    old_path = _mailed_path()
    resent = client.post(f"/api/v1/invitations/{body['id']}/resend")
    assert resent.status_code == 200, resent.content
    assert resent.json()["emailed"] is True and len(mail.outbox) == 2
    new_path = _mailed_path()
    assert new_path != old_path and resent.json()["url"].endswith(new_path)
    invitee = _manager(charlie)
    assert invitee.get(old_path).status_code == 404
    assert invitee.post(new_path).status_code == 302
    assert Membership.objects.filter(user=charlie, organization=org_a).exists()
    # Accepted: nothing left to resend.
    assert_error(client.post(f"/api/v1/invitations/{body['id']}/resend"), 409)


def test_members_and_other_organizations_cannot_cancel_or_resend(org_a, org_b, alice, bob, charlie):
    invitation = invitation_create(actor=alice, organization=org_a, email="x@example.com")
    pk = invitation.invitation.pk
    member = _manager(bob)
    assert_error(member.delete(f"/api/v1/invitations/{pk}"), 403)
    assert_error(member.post(f"/api/v1/invitations/{pk}/resend"), 403)
    outsider = _manager(charlie)  # owner of org_b
    assert_error(outsider.delete(f"/api/v1/invitations/{pk}"), 404)
    assert_error(outsider.post(f"/api/v1/invitations/{pk}/resend"), 404)
    assert Invitation.objects.get(pk=pk).revoked_at is None
    anonymous = Client()
    assert anonymous.delete(f"/api/v1/invitations/{pk}").status_code in (401, 403)


def _sign_up_from(path: str, email: str) -> Client:
    """A visitor without an account opens the invitation link, signs up from the login page
    it leads to, and opens the confirmation link mailed to `email`."""
    client = Client()
    to_login = client.get(path)
    assert to_login.status_code == 302
    login_page = client.get(to_login["Location"])
    signup_href = re.search(r'href="(/accounts/signup/[^"]*)"', login_page.content.decode())
    assert signup_href, "the login page links to sign-up, keeping the invitation"
    signup_url = signup_href.group(1).replace("&amp;", "&")
    client.post(signup_url, {"email": email})
    confirm = re.search(r"(/accounts/signup/confirm/\S+/)", mail.outbox[-1].body)
    assert confirm, mail.outbox[-1].body
    client.created = client.post(confirm.group(1), {"password": "a long enough passphrase"})  # type: ignore[attr-defined]
    return client


def test_signup_from_the_invitation_joins_the_inviting_organization(org_a, alice):
    _invite(_manager(alice), "newcomer@example.com", "admin")
    client = _sign_up_from(_mailed_path(), "newcomer@example.com")
    assert client.created.status_code == 302 and client.created["Location"] == "/"  # type: ignore[attr-defined]
    newcomer = User.objects.get(email="newcomer@example.com")
    assert [(m.organization, m.role) for m in Membership.objects.filter(user=newcomer)] == [
        (org_a, Role.ADMIN)
    ]
    dashboard = client.get("/")
    assert "you joined Org A" in dashboard.content.decode()
    assert client.get("/api/v1/organization").json()["slug"] == "org-a"


def test_signup_from_the_invitation_with_another_address_does_not_join(org_a, alice):
    _invite(_manager(alice), "newcomer@example.com")
    path = _mailed_path()
    client = _sign_up_from(path, "someone-else@example.com")
    other = User.objects.get(email="someone-else@example.com")
    assert not Membership.objects.filter(user=other, organization=org_a).exists()
    assert Organization.objects.filter(memberships__user=other).count() == 1  # their own
    # Back on the link, they are told it is for a different account.
    assert client.created["Location"] == path  # type: ignore[attr-defined]
    assert client.get(path).status_code == 403
