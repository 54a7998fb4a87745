"""Closing periods: one invoice per organization and period, the right plan, exact amounts."""

from __future__ import annotations

import threading
from datetime import UTC, date, datetime

import pytest
from django.db import connection

from billing import selectors, services
from billing.metering import metering_record
from billing.models import Invoice, Payment, UsageDaily
from common.errors import Conflict

pytestmark = pytest.mark.django_db(transaction=True)
JANUARY = date(2025, 1, 1)
AFTER_JANUARY = datetime(2025, 2, 1, 1, 0, tzinfo=UTC)


def backdate(*orgs) -> None:  # type: ignore[no-untyped-def]
    for org in orgs:
        type(org).objects.filter(pk=org.pk).update(created_at=datetime(2024, 12, 1, tzinfo=UTC))


def test_close_issues_one_invoice_with_the_executions_of_the_period(org_a, free_org):  # type: ignore[no-untyped-def]
    backdate(org_a, free_org)
    metering_record(
        organization_id=org_a.pk,
        api_key_id=None,
        operation="command",
        occurred_at=datetime(2025, 1, 1, tzinfo=UTC),
    )
    metering_record(
        organization_id=org_a.pk,
        api_key_id=None,
        operation="command",
        occurred_at=datetime(2025, 1, 31, 23, 59, 59, 999000, tzinfo=UTC),
    )
    metering_record(
        organization_id=org_a.pk,
        api_key_id=None,
        operation="command",
        occurred_at=datetime(2025, 2, 1, tzinfo=UTC),
    )
    invoices = services.billing_periods_close(now=AFTER_JANUARY)  # flushes first
    assert [(i.organization_id, i.period_start, i.executions, i.total_cents) for i in invoices] == [
        (org_a.pk, JANUARY, 2, 9_700)
    ]
    invoice = invoices[0]
    assert invoice.status == "open" and invoice.period_end == date(2025, 2, 1)
    assert [(line.kind, line.amount_cents) for line in invoice.lines.all()] == [("base", 9_700)]
    assert services.billing_periods_close(now=AFTER_JANUARY) == []
    assert Invoice.objects.count() == 1  # the free organization has nothing to pay


def test_overage_invoice_at_250000_executions(org_a):  # type: ignore[no-untyped-def]
    backdate(org_a)
    UsageDaily.objects.create(
        organization=org_a, day=date(2025, 1, 10), api_key_ref=0, count=200_000
    )
    UsageDaily.objects.create(
        organization=org_a, day=date(2025, 1, 31), api_key_ref=3, count=50_000
    )
    invoice = services.invoice_close_period(organization=org_a, start=JANUARY)
    assert invoice is not None and invoice.total_cents == 24_250 and invoice.executions == 250_000
    assert [(line.kind, line.quantity, line.amount_cents) for line in invoice.lines.all()] == [
        ("base", 1, 9_700),
        ("overage", 150_000, 14_550),
    ]


def test_period_is_not_closed_before_the_grace_after_its_end(org_a):  # type: ignore[no-untyped-def]
    backdate(org_a)
    early = services.billing_periods_close(now=datetime(2025, 2, 1, 0, 2, tzinfo=UTC))
    assert [invoice.period_start for invoice in early] == [date(2024, 12, 1)]  # not January yet
    late = services.billing_periods_close(now=datetime(2025, 2, 1, 0, 6, tzinfo=UTC))
    assert [invoice.period_start for invoice in late] == [JANUARY]


def test_two_workers_closing_at_once_issue_one_invoice(org_a, org_b, monkeypatch):  # type: ignore[no-untyped-def]
    backdate(org_a, org_b)
    barrier = threading.Barrier(2, timeout=10)
    original = selectors.plan_for_period

    def both_past_the_existence_check(**kwargs):  # type: ignore[no-untyped-def]
        if kwargs["organization"].pk == org_a.pk:
            barrier.wait()
        return original(**kwargs)

    monkeypatch.setattr(services, "plan_for_period", both_past_the_existence_check)
    results: list[object] = []

    def close() -> None:
        try:
            results.append(
                services.invoice_close_period(
                    organization=type(org_a).objects.get(pk=org_a.pk), start=JANUARY
                )
            )
            results.append(services.billing_periods_close(now=AFTER_JANUARY))
        except BaseException as exc:  # noqa: BLE001
            results.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=close) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert Invoice.objects.filter(organization=org_a).count() == 1
    assert Invoice.objects.filter(organization=org_b).count() == 1
    invoice_ids = {r.pk for r in results if isinstance(r, Invoice)}
    assert len(invoice_ids) == 1  # the loser returned the winner's invoice


def test_upgrade_mid_period_bills_the_whole_period_as_premium(free_org, charlie):  # type: ignore[no-untyped-def]
    backdate(free_org)
    services.organization_plan_change(
        organization=free_org,
        plan="premium",
        requested_by=charlie,
        now=datetime(2025, 1, 20, tzinfo=UTC),
    )
    invoice = services.invoice_close_period(organization=free_org, start=JANUARY)
    assert invoice is not None and invoice.plan == "premium" and invoice.total_cents == 9_700
    assert services.invoice_close_period(organization=free_org, start=date(2024, 12, 1)) is None


def test_downgrade_mid_period_keeps_the_period_premium_and_the_next_free(org_a, alice):  # type: ignore[no-untyped-def]
    backdate(org_a)
    services.organization_plan_change(
        organization=org_a, plan="free", requested_by=alice, now=datetime(2025, 1, 10, tzinfo=UTC)
    )
    services.plan_changes_apply_all_due(now=datetime(2025, 2, 1, 0, 1, tzinfo=UTC))
    org_a.refresh_from_db()
    assert org_a.plan == "free"  # applied at the period start...
    assert (
        selectors.plan_for_period(organization=org_a, start=JANUARY) == "premium"
    )  # ...January stays premium
    assert selectors.plan_for_period(organization=org_a, start=date(2025, 2, 1)) == "free"
    assert services.invoice_close_period(organization=org_a, start=JANUARY).total_cents == 9_700  # type: ignore[union-attr]
    assert services.invoice_close_period(organization=org_a, start=date(2025, 2, 1)) is None


def test_mark_paid_records_a_payment_once_and_void_cannot_be_paid(org_a, alice):  # type: ignore[no-untyped-def]
    backdate(org_a)
    invoice = services.invoice_close_period(organization=org_a, start=JANUARY)
    assert invoice is not None
    services.invoice_mark_paid(invoice=invoice, recorded_by=alice, reference="wire 42")
    services.invoice_mark_paid(invoice=invoice, recorded_by=alice, reference="again")
    assert invoice.status == "paid" and invoice.paid_at is not None
    assert list(Payment.objects.values_list("amount_cents", "reference")) == [(9_700, "wire 42")]
    with pytest.raises(Conflict):
        services.invoice_void(invoice=invoice)
    UsageDaily.objects.all().delete()
    other = Invoice.objects.create(
        organization=org_a,
        period_start=date(2024, 12, 1),
        period_end=JANUARY,
        plan="premium",
        executions=0,
        included_executions=100_000,
        total_cents=9_700,
    )
    services.invoice_void(invoice=other)
    with pytest.raises(Conflict) as refused:
        services.invoice_mark_paid(invoice=other, recorded_by=alice)
    assert refused.value.code == "invoice_void"


def test_a_gateway_that_collects_marks_the_invoice_paid(org_a, settings):  # type: ignore[no-untyped-def]
    settings.SANDPIT_PAYMENT_GATEWAY = "tests.billing.test_invoices.AlwaysPaysGateway"
    backdate(org_a)
    invoice = services.invoice_close_period(organization=org_a, start=JANUARY)
    assert invoice is not None and invoice.status == "paid"
    assert Payment.objects.get().gateway == "always"


class AlwaysPaysGateway:
    name = "always"

    def charge(self, *, invoice):  # type: ignore[no-untyped-def]
        from billing.payments import ChargeResult

        return ChargeResult(status="succeeded", gateway=self.name, reference=f"ch_{invoice.pk}")


def test_tasks_are_thin_and_idempotent(org_a, monkeypatch):  # type: ignore[no-untyped-def]
    from billing import tasks

    metering_record(organization_id=org_a.pk, api_key_id=None, operation="command")
    assert tasks.flush_usage() == 1
    assert tasks.flush_usage() == 0
    backdate(org_a)  # a premium organization older than last month: it owes last month's base
    assert tasks.close_billing_periods() == 1
    assert tasks.close_billing_periods() == 0  # already issued: no second invoice
    assert Invoice.objects.filter(organization=org_a).count() == 1
