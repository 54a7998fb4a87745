"""The billing REST API: success, validation, unauthenticated and cross-organization cases."""

from __future__ import annotations

import csv
import io
from datetime import date

import pytest
from rest_framework.test import APIClient

from accounts.models import User
from billing import services
from billing.metering import metering_record
from billing.models import Invoice, Payment
from tests.conftest import assert_error

pytestmark = pytest.mark.django_db


def session(user: User) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def make_invoice(org, period: date = date(2025, 1, 1)) -> Invoice:  # type: ignore[no-untyped-def]
    return Invoice.objects.create(
        organization=org,
        period_start=period,
        period_end=date(period.year, period.month + 1, 1),
        plan="premium",
        executions=5,
        included_executions=100_000,
        total_cents=9_700,
    )


@pytest.fixture
def staff(db) -> User:  # type: ignore[no-untyped-def]
    return User.objects.create_user(email="staff@example.com", password="x", is_staff=True)


# --- usage --------------------------------------------------------------------------------------------


def test_usage_shows_the_current_period_including_unflushed(api_a, org_a):  # type: ignore[no-untyped-def]
    key_id = org_a.api_keys.get().pk
    for _ in range(3):
        metering_record(organization_id=org_a.pk, api_key_id=key_id, operation="command")
    services.usage_flush()
    metering_record(organization_id=org_a.pk, api_key_id=None, operation="command")
    response = api_a.get("/api/v1/usage")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["executions"] == 4 and body["plan"] == "premium"
    assert (
        body["included_executions"] == 100_000 and body["remaining_included_executions"] == 99_996
    )
    assert body["amount_so_far_cents"] == 9_700 and body["projected_cents"] >= 9_700
    assert (
        body["by_day"][-1]["executions"] == 4 and sum(d["executions"] for d in body["by_day"]) == 4
    )
    assert {(k["api_key_id"], k["name"], k["executions"]) for k in body["by_key"]} == {
        (key_id, "key a", 3),
        (None, "(no API key)", 1),
    }


def test_usage_is_per_organization(api_b, org_a, org_b):  # type: ignore[no-untyped-def]
    metering_record(organization_id=org_a.pk, api_key_id=None, operation="command")
    assert api_b.get("/api/v1/usage").json()["executions"] == 0


@pytest.mark.parametrize("url", ["/api/v1/usage.csv", "/api/v1/usage?format=csv"])
def test_usage_csv_export(api_a, org_a, url):  # type: ignore[no-untyped-def]
    key_id = org_a.api_keys.get().pk
    metering_record(organization_id=org_a.pk, api_key_id=key_id, operation="command")
    metering_record(organization_id=org_a.pk, api_key_id=key_id, operation="command")
    response = api_a.get(url)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows[0] == ["day", "api_key_id", "api_key_name", "executions"]
    assert [row[1:] for row in rows[1:]] == [[str(key_id), "key a", "2"]]


@pytest.mark.parametrize(
    "url",
    [
        "/api/v1/usage",
        "/api/v1/usage.csv",
        "/api/v1/invoices",
        "/api/v1/invoices/upcoming",
        "/api/v1/invoices/1",
        "/api/v1/billing/plan",
    ],
)
def test_billing_reads_need_authentication(anon_api, url):  # type: ignore[no-untyped-def]
    assert_error(anon_api.get(url), 401, "not_authenticated")


# --- invoices -------------------------------------------------------------------------------------------


def test_invoice_list_is_paginated_and_per_organization(api_a, org_a, org_b):  # type: ignore[no-untyped-def]
    for month in (1, 2, 3):
        make_invoice(org_a, date(2025, month, 1))
    make_invoice(org_b)
    response = api_a.get("/api/v1/invoices?limit=2")
    assert response.status_code == 200
    body = response.json()
    assert body["count"] == 3 and len(body["results"]) == 2 and body["next"]
    assert [i["period_start"] for i in body["results"]] == ["2025-03-01", "2025-02-01"]


def test_invoice_detail_and_other_organizations_invoice_is_404(api_a, api_b, org_a):  # type: ignore[no-untyped-def]
    invoice = services.invoice_close_period(organization=org_a, start=date(2025, 1, 1))
    assert invoice is not None
    response = api_a.get(f"/api/v1/invoices/{invoice.pk}")
    assert response.status_code == 200
    body = response.json()
    assert body["total_cents"] == 9_700 and body["total"] == "$97.00" and body["status"] == "open"
    assert body["lines"][0]["kind"] == "base" and body["lines"][0]["amount_cents"] == 9_700
    assert_error(api_b.get(f"/api/v1/invoices/{invoice.pk}"), 404, "not_found")
    assert_error(api_a.get("/api/v1/invoices/999999"), 404, "not_found")


def test_upcoming_invoice_previews_the_current_period(api_a, org_a):  # type: ignore[no-untyped-def]
    metering_record(organization_id=org_a.pk, api_key_id=None, operation="command")
    body = api_a.get("/api/v1/invoices/upcoming").json()
    assert body["executions"] == 1 and body["total_cents"] == 9_700 and body["plan"] == "premium"
    assert body["projected"]["total_cents"] >= 9_700
    assert body["lines"][0]["kind"] == "base"


def test_mark_paid_is_for_staff_sessions_only(staff, alice, api_a, org_a):  # type: ignore[no-untyped-def]
    invoice = make_invoice(org_a)
    url = f"/api/v1/invoices/{invoice.pk}/mark-paid"
    assert_error(api_a.post(url, {}, format="json"), 403, "permission_denied")
    assert_error(session(alice).post(url, {}, format="json"), 403, "permission_denied")
    assert_error(APIClient().post(url, {}, format="json"), 401, "not_authenticated")
    response = session(staff).post(url, {"reference": "wire 7"}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "paid"
    assert Payment.objects.get().reference == "wire 7"
    assert_error(session(staff).post("/api/v1/invoices/999999/mark-paid", {}, format="json"), 404)
    assert_error(
        session(staff).post(url, {"reference": "x" * 201}, format="json"), 400, "validation_error"
    )


# --- plan and spending cap -------------------------------------------------------------------------------


def test_owner_downgrades_from_the_next_period_and_upgrades_back(alice, org_a):  # type: ignore[no-untyped-def]
    client = session(alice)
    response = client.post("/api/v1/billing/plan", {"plan": "free"}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["plan"] == "premium" and body["scheduled_plan"] == "free" and body["scheduled_at"]
    assert client.get("/api/v1/billing/plan").json()["scheduled_plan"] == "free"
    body = client.post("/api/v1/billing/plan", {"plan": "premium"}, format="json").json()
    assert body == {"plan": "premium", "scheduled_plan": None, "scheduled_at": None}


def test_plan_change_validation_and_permissions(alice, bob, api_a, anon_api, org_a):  # type: ignore[no-untyped-def]
    assert_error(
        session(alice).post("/api/v1/billing/plan", {"plan": "gold"}, format="json"),
        400,
        "validation_error",
    )
    assert_error(session(bob).post("/api/v1/billing/plan", {"plan": "free"}, format="json"), 403)
    assert_error(api_a.post("/api/v1/billing/plan", {"plan": "free"}, format="json"), 403)
    assert_error(anon_api.post("/api/v1/billing/plan", {"plan": "free"}, format="json"), 401)


def test_plan_change_applies_to_the_callers_organization_only(charlie, org_a, org_b):  # type: ignore[no-untyped-def]
    session(charlie).post("/api/v1/billing/plan", {"plan": "free"}, format="json")
    assert not org_a.plan_changes.exists() and org_b.plan_changes.count() == 1


def test_spending_cap_set_clear_and_validate(alice, bob, api_a, anon_api, org_a):  # type: ignore[no-untyped-def]
    client = session(alice)
    response = client.put("/api/v1/billing/spending-cap", {"cap_cents": 20_000}, format="json")
    assert response.status_code == 200 and response.json() == {"cap_cents": 20_000}
    org_a.refresh_from_db()
    assert org_a.spending_cap_cents == 20_000
    assert client.put(
        "/api/v1/billing/spending-cap", {"cap_cents": None}, format="json"
    ).json() == {"cap_cents": None}
    assert_error(
        client.put("/api/v1/billing/spending-cap", {"cap_cents": -1}, format="json"),
        400,
        "validation_error",
    )
    assert_error(
        client.put("/api/v1/billing/spending-cap", {}, format="json"), 400, "validation_error"
    )
    assert_error(
        session(bob).put("/api/v1/billing/spending-cap", {"cap_cents": 1}, format="json"), 403
    )
    assert_error(api_a.put("/api/v1/billing/spending-cap", {"cap_cents": 1}, format="json"), 403)
    assert_error(anon_api.put("/api/v1/billing/spending-cap", {"cap_cents": 1}, format="json"), 401)
