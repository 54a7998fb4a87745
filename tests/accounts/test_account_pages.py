"""Account pages wear the app's own templates, not Django admin's."""

from __future__ import annotations

import pytest
from django.core import mail
from django.test import Client

pytestmark = pytest.mark.django_db


def _main(response) -> str:  # type: ignore[no-untyped-def]
    assert response.status_code == 200
    body = response.content.decode()
    assert "Django administration" not in body and 'class="topbar"' in body
    return body.split("<main", 1)[1]


def test_password_reset_pages_use_the_app_templates(alice, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    client = Client()
    assert "Reset your password" in _main(client.get("/accounts/password_reset/"))
    sent = client.post("/accounts/password_reset/", {"email": "alice@example.com"}, follow=True)
    assert "Check your email" in _main(sent)
    link = next(line for line in mail.outbox[0].body.splitlines() if "/reset/" in line).strip()
    form = client.get(link[link.index("/accounts/reset/") :], follow=True)
    assert "Choose a new password" in _main(form)
    done = client.post(
        form.redirect_chain[-1][0],
        {"new_password1": "brand new pass 123", "new_password2": "brand new pass 123"},
        follow=True,
    )
    assert "Your password is changed" in _main(done)
    assert "Django" not in mail.outbox[0].body


def test_a_used_reset_link_says_so_in_the_app_template(alice):
    page = Client().get("/accounts/reset/MQ/set-password/", follow=True)
    assert "does not work any more" in _main(page)


def test_logged_out_front_page_says_what_sandpit_is():
    page = Client().get("/", follow=True)
    body = _main(page)
    assert "code sandboxes" in body
    assert 'href="/accounts/signup/' in body and 'name="password"' in body
