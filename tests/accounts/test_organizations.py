from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.sessions.models import Session
from django.core import mail
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.authentication import principal_for_session_user
from accounts.models import Invitation, Membership, Role, User
from accounts.services import invitation_accept, invitation_create
from common.errors import ApplicationError
from tests.conftest import assert_error

pytestmark = pytest.mark.django_db


def test_signup_creates_user_and_owned_organization(client, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    sent = client.post(
        "/accounts/signup/", {"email": "New@example.com", "organization_name": "Newco"}
    )
    assert sent.status_code == 200 and b"Check your email" in sent.content
    assert not User.objects.filter(email__iexact="new@example.com").exists()
    link = next(line for line in mail.outbox[0].body.splitlines() if "/signup/confirm/" in line)
    response = client.post(
        link[link.index("/accounts/") :].strip(), {"password": "a long enough passphrase"}
    )
    assert response.status_code == 302
    user = User.objects.get(email="new@example.com")
    membership = Membership.objects.get(user=user)
    assert membership.role == Role.OWNER and membership.organization.name == "Newco"
    assert client.get("/").status_code == 200


def test_login_with_email_and_password(client, alice):
    response = client.post(
        "/accounts/login/", {"username": "alice@example.com", "password": "correct horse battery"}
    )
    assert response.status_code == 302
    from django.test import Client

    wrong = Client().post("/accounts/login/", {"username": "alice@example.com", "password": "nope"})
    assert wrong.status_code == 200 and b"didn't match" in wrong.content


def test_password_reset_sends_an_email_with_a_working_link(client, alice, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    client.post("/accounts/password_reset/", {"email": "alice@example.com"})
    assert len(mail.outbox) == 1
    link = next(line for line in mail.outbox[0].body.splitlines() if "/reset/" in line).strip()
    path = link[link.index("/accounts/reset/") :]
    form_page = client.get(path, follow=True)
    set_path = form_page.redirect_chain[-1][0]
    done = client.post(
        set_path, {"new_password1": "brand new pass 123", "new_password2": "brand new pass 123"}
    )
    assert done.status_code == 302
    alice.refresh_from_db()
    assert alice.check_password("brand new pass 123")


def test_user_switches_between_organizations(client, alice, org_a, org_b):
    Membership.objects.create(user=alice, organization=org_b, role=Role.MEMBER)
    client.force_login(alice)
    assert client.get("/api/v1/organization").json()["slug"] == "org-a"
    client.post("/organizations/switch/", {"organization": org_b.pk})
    assert client.get("/api/v1/organization").json()["slug"] == "org-b"


def test_cannot_switch_to_an_organization_without_membership(client, alice, org_a, org_b):
    client.force_login(alice)
    client.post("/organizations/switch/", {"organization": org_b.pk})
    assert client.get("/api/v1/organization").json()["slug"] == "org-a"


def test_a_session_reads_its_organization_and_role_in_one_statement(client, alice, org_a, org_b):
    """Every API request of a browser session needs the organization it works in and the
    user's role there: one statement for both, the role of the organization chosen."""
    Membership.objects.create(user=alice, organization=org_b, role=Role.MEMBER)
    client.force_login(alice)
    client.post("/organizations/switch/", {"organization": org_b.pk})
    with CaptureQueriesContext(connection) as queries:
        response = client.get("/api/v1/organization")
    assert response.json()["slug"] == "org-b"
    reads = [
        q["sql"]
        for q in queries.captured_queries
        if '"accounts_membership"' in q["sql"] or '"accounts_organization"' in q["sql"]
    ]
    assert len(reads) == 1, reads
    principal = principal_for_session_user(response.wsgi_request)
    assert principal is not None and principal.organization_id == org_b.pk
    assert principal.role == Role.MEMBER and not principal.can_manage
    # Removed from the chosen organization: the session works in the first left, by name.
    Membership.objects.filter(user=alice, organization=org_b).delete()
    assert client.get("/api/v1/organization").json()["slug"] == "org-a"
    principal = principal_for_session_user(response.wsgi_request)
    assert principal is not None and principal.organization_id == org_a.pk
    assert principal.role == Membership.objects.get(user=alice, organization=org_a).role


def test_a_session_ends_with_its_user_its_password_or_its_row(client, alice, org_a):
    """The session's user is read again by every request: deactivated, with a new password
    (Django's session hash), or its session deleted, the next request is refused, by the
    API and by the pages (which only Django's authentication guards)."""
    for end in ("deactivated", "password", "session deleted"):
        client.force_login(alice)
        assert client.get("/api/v1/organization").status_code == 200
        assert client.get("/team/").status_code == 200
        if end == "deactivated":
            User.objects.filter(pk=alice.pk).update(is_active=False)
        elif end == "password":
            alice.set_password("a different one 456")
            alice.save(update_fields=["password"])
        else:
            Session.objects.all().delete()
        page = client.get("/team/")
        assert page.status_code == 302 and "/accounts/login/" in page["Location"], end
        refused = client.get("/api/v1/organization")
        assert refused.status_code in (401, 403), (end, refused.content)
        assert refused.json()["error"]["code"] in ("not_authenticated", "authentication_failed")
        User.objects.filter(pk=alice.pk).update(is_active=True)
        alice.refresh_from_db()


def test_invitation_is_single_use(org_a, alice, charlie):
    issued = invitation_create(actor=alice, organization=org_a, email="charlie@example.com")
    invitation_accept(token=issued.token, user=charlie)
    assert Membership.objects.get(user=charlie, organization=org_a).role == Role.MEMBER
    with pytest.raises(ApplicationError) as excinfo:
        invitation_accept(token=issued.token, user=charlie)
    assert excinfo.value.code == "invitation_used"


def test_invitation_expires(org_a, alice, charlie):
    issued = invitation_create(actor=alice, organization=org_a, email="charlie@example.com")
    Invitation.objects.filter(pk=issued.invitation.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    with pytest.raises(ApplicationError) as excinfo:
        invitation_accept(token=issued.token, user=charlie)
    assert excinfo.value.code == "invitation_expired"


def test_invitation_link_in_browser(client, org_a, alice, charlie):
    issued = invitation_create(
        actor=alice, organization=org_a, email="charlie@example.com", role="admin"
    )
    assert Invitation.objects.get(pk=issued.invitation.pk).token_hash != issued.token
    client.force_login(charlie)
    page = client.get(f"/invitations/{issued.token}/")
    assert page.status_code == 200 and b"Org A" in page.content
    assert client.post(f"/invitations/{issued.token}/").status_code == 302
    assert Membership.objects.get(user=charlie, organization=org_a).role == Role.ADMIN
    again = client.post(f"/invitations/{issued.token}/")
    assert again.status_code == 409


def test_member_cannot_invite(client, org_a, bob):
    client.force_login(bob)
    response = client.post(
        "/api/v1/invitations", {"email": "x@example.com"}, content_type="application/json"
    )
    assert_error(response, 403)


def test_admin_invites_through_api(client, org_a, alice):
    client.force_login(alice)
    response = client.post(
        "/api/v1/invitations",
        {"email": "x@example.com", "role": "member"},
        content_type="application/json",
    )
    assert response.status_code == 201
    assert "/invitations/" in response.json()["url"]


def test_member_cannot_change_roles_and_last_owner_is_kept(client, org_a, alice, bob):
    bob_membership = Membership.objects.get(user=bob, organization=org_a)
    alice_membership = Membership.objects.get(user=alice, organization=org_a)
    client.force_login(bob)
    assert_error(
        client.patch(
            f"/api/v1/members/{alice_membership.pk}",
            {"role": "member"},
            content_type="application/json",
        ),
        403,
    )
    client.force_login(alice)
    assert_error(
        client.patch(
            f"/api/v1/members/{alice_membership.pk}",
            {"role": "member"},
            content_type="application/json",
        ),
        409,
        "last_owner",
    )
    ok = client.patch(
        f"/api/v1/members/{bob_membership.pk}", {"role": "admin"}, content_type="application/json"
    )
    assert ok.status_code == 200 and ok.json()["role"] == "admin"
