"""Billing tables: the usage ledger and its daily rollup, plan history, invoices, payments,
and stored responses for idempotent requests.

Money is a ledger: `UsageEvent` is append-only with a unique `event_id`, every other usage
number (daily rollups, invoices) is derived from it, and amounts are integer cents.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from accounts.models import Organization, Plan


class UsageEvent(models.Model):
    """One counted execution: the append-only ledger every usage figure is derived from.

    Why a row per execution: `event_id` is UNIQUE, so an execution recorded twice (a retried
    request, a flush re-run after a crash) is stored once, ever, and the invoice can be
    audited execution by execution. Rows are never updated except to stamp `aggregated_at`
    when the daily rollup has absorbed them, and never deleted while the organization exists.
    """

    event_id = models.CharField(max_length=100, unique=True)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+")
    api_key_id = models.BigIntegerField(
        null=True,
        blank=True,
        help_text="The API key that made the call; empty for sessions and sandbox tokens.",
    )
    operation = models.CharField(max_length=64)
    occurred_at = models.DateTimeField(help_text="When the execution was recorded (UTC).")
    aggregated_at = models.DateTimeField(
        null=True, blank=True, help_text="When UsageDaily absorbed this row; empty = not yet."
    )

    class Meta:
        indexes = [
            models.Index(fields=["organization", "occurred_at"], name="usage_event_org_time"),
            models.Index(
                fields=["id"],
                condition=Q(aggregated_at__isnull=True),
                name="usage_event_unaggregated",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event_id} {self.operation} org={self.organization_id}"


class UsageDaily(models.Model):
    """Executions per organization, UTC day and API key: the rollup of UsageEvent.

    Exists so charts, the CSV export, the allowance and invoices read a few rows per
    period instead of counting the ledger. Written only by the flush, in the same
    transaction that inserts (or stamps) the ledger rows it adds up.
    """

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+")
    day = models.DateField()
    api_key_ref = models.BigIntegerField(
        default=0, help_text="ApiKey id, or 0 for calls made without an API key."
    )
    count = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["organization", "day", "api_key_ref"], name="one_usage_row_per_org_day_key"
            )
        ]

    def __str__(self) -> str:
        return f"org={self.organization_id} {self.day} key={self.api_key_ref}: {self.count}"


class PlanChange(models.Model):
    """A change of an organization's plan and the instant it takes effect.

    Why: invoices for a closed period must use the plan that was in effect then, not the
    plan now. Upgrades take effect when requested; downgrades at the start of the next
    period. `applied_at` is stamped once Organization.plan reflects the change.
    """

    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="plan_changes"
    )
    previous_plan = models.CharField(max_length=20, choices=Plan.choices)
    plan = models.CharField(max_length=20, choices=Plan.choices)
    requested_at = models.DateTimeField(default=timezone.now)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    effective_at = models.DateTimeField()
    applied_at = models.DateTimeField(null=True, blank=True)
    canceled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["organization", "effective_at"], name="plan_change_org_time")
        ]

    def __str__(self) -> str:
        return f"{self.organization_id}: {self.previous_plan} → {self.plan} at {self.effective_at:%Y-%m-%d %H:%M}"


class InvoiceStatus(models.TextChoices):
    OPEN = "open", "Open"
    PAID = "paid", "Paid"
    VOID = "void", "Void"


class Invoice(models.Model):
    """What an organization owes for one closed billing period (a UTC calendar month).

    One per organization and period (a unique constraint), so closing a period twice,
    even from two workers at once, issues one invoice. Amounts are integer cents.
    """

    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="invoices"
    )
    period_start = models.DateField(help_text="First day of the billed UTC month.")
    period_end = models.DateField(help_text="First day of the following month (exclusive).")
    plan = models.CharField(max_length=20, choices=Plan.choices)
    executions = models.PositiveBigIntegerField()
    included_executions = models.PositiveBigIntegerField()
    total_cents = models.PositiveBigIntegerField()
    currency = models.CharField(max_length=3, default="usd")
    status = models.CharField(
        max_length=10, choices=InvoiceStatus.choices, default=InvoiceStatus.OPEN
    )
    issued_at = models.DateTimeField(default=timezone.now)
    paid_at = models.DateTimeField(null=True, blank=True)
    voided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["organization", "period_start"], name="one_invoice_per_org_period"
            )
        ]
        ordering = ["-period_start", "-id"]

    def __str__(self) -> str:
        return f"{self.organization_id} {self.period_start:%Y-%m} {self.total_cents}¢ {self.status}"


class InvoiceLineItem(models.Model):
    """A line of an invoice: the base fee or the overage. Written with the invoice, never edited."""

    invoice = models.ForeignKey(Invoice, on_delete=models.CASCADE, related_name="lines")
    kind = models.CharField(max_length=20)
    description = models.CharField(max_length=200)
    quantity = models.PositiveBigIntegerField()
    unit_price_cents = models.DecimalField(max_digits=12, decimal_places=4)
    amount_cents = models.PositiveBigIntegerField()

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.kind}: {self.amount_cents}¢"


class Payment(models.Model):
    """Money received against an invoice, as reported by a payment gateway (or staff by hand)."""

    invoice = models.ForeignKey(Invoice, on_delete=models.PROTECT, related_name="payments")
    amount_cents = models.PositiveBigIntegerField()
    gateway = models.CharField(max_length=40)
    reference = models.CharField(max_length=200, blank=True)
    recorded_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.amount_cents}¢ via {self.gateway} for invoice {self.invoice_id}"


class IdempotencyState(models.TextChoices):
    IN_FLIGHT = "in_flight", "In flight"
    COMPLETED = "completed", "Completed"


class IdempotencyRecord(models.Model):
    """An `Idempotency-Key` seen on a metered request, and the response it produced.

    Why: a client retrying after a timeout must get the first response back rather than
    run (and pay for) the operation twice. Unique per organization and key.
    """

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=64)
    state = models.CharField(max_length=10, choices=IdempotencyState.choices)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    body = models.BinaryField(null=True, blank=True)
    content_type = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["organization", "key"], name="one_idempotency_key_per_org"
            )
        ]
        indexes = [models.Index(fields=["created_at"], name="idempotency_created")]

    def __str__(self) -> str:
        return f"{self.organization_id}:{self.key} ({self.state})"
