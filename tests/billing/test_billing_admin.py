"""Django admin: every billing model has a working page; "mark paid" works as an action."""

from __future__ import annotations

from datetime import date

import pytest
from django.core.management import call_command

from accounts.models import User
from billing import services
from billing.metering import metering_record
from billing.models import Invoice

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client_(client, db):  # type: ignore[no-untyped-def]
    user = User.objects.create_superuser(email="root@example.com", password="x")
    client.force_login(user)
    return client


@pytest.mark.parametrize(
    "model", ["usageevent", "usagedaily", "planchange", "invoice", "payment", "idempotencyrecord"]
)
def test_changelists_render(admin_client_, model, org_a):  # type: ignore[no-untyped-def]
    metering_record(organization_id=org_a.pk, api_key_id=None, operation="command")
    services.usage_flush()
    services.invoice_close_period(organization=org_a, start=date(2025, 1, 1))
    assert admin_client_.get(f"/admin/billing/{model}/").status_code == 200


def test_mark_paid_admin_action(admin_client_, org_a):  # type: ignore[no-untyped-def]
    invoice = services.invoice_close_period(organization=org_a, start=date(2025, 1, 1))
    assert invoice is not None
    assert admin_client_.get(f"/admin/billing/invoice/{invoice.pk}/change/").status_code == 200
    response = admin_client_.post(
        "/admin/billing/invoice/",
        {"action": "mark_paid", "_selected_action": [invoice.pk]},
        follow=True,
    )
    assert response.status_code == 200
    invoice.refresh_from_db()
    assert (
        invoice.status == "paid" and invoice.payments.get().recorded_by.email == "root@example.com"
    )


def test_management_commands(org_a, capsys):  # type: ignore[no-untyped-def]
    metering_record(organization_id=org_a.pk, api_key_id=None, operation="command")
    call_command("billing_flush")
    call_command("billing_close_period", "--period", "2025-01")
    assert Invoice.objects.filter(organization=org_a, period_start=date(2025, 1, 1)).exists()
    assert "$97.00" in capsys.readouterr().out
