"""Django admin for every billing table. The ledger and rollup are read-only here."""

from __future__ import annotations

from collections.abc import Callable

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from accounts.permissions import signed_in_user
from common.errors import ApplicationError

from . import services
from .models import (
    IdempotencyRecord,
    Invoice,
    InvoiceLineItem,
    Payment,
    PlanChange,
    UsageDaily,
    UsageEvent,
)


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(UsageEvent)
class UsageEventAdmin(ReadOnlyAdmin):
    list_display = [
        "event_id",
        "organization",
        "api_key_id",
        "operation",
        "occurred_at",
        "aggregated_at",
    ]
    list_filter = ["operation"]
    search_fields = ["event_id", "organization__slug"]
    date_hierarchy = "occurred_at"
    list_select_related = ["organization"]


@admin.register(UsageDaily)
class UsageDailyAdmin(ReadOnlyAdmin):
    list_display = ["organization", "day", "api_key_ref", "count"]
    search_fields = ["organization__slug"]
    date_hierarchy = "day"
    list_select_related = ["organization"]


@admin.register(PlanChange)
class PlanChangeAdmin(ReadOnlyAdmin):
    list_display = [
        "organization",
        "previous_plan",
        "plan",
        "requested_at",
        "effective_at",
        "applied_at",
        "canceled_at",
    ]
    search_fields = ["organization__slug"]
    list_select_related = ["organization"]


class InvoiceLineItemInline(admin.TabularInline):
    model = InvoiceLineItem
    extra = 0
    can_delete = False
    readonly_fields = ["kind", "description", "quantity", "unit_price_cents", "amount_cents"]

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


class PaymentInline(admin.TabularInline):
    model = Payment
    extra = 0
    can_delete = False
    readonly_fields = ["amount_cents", "gateway", "reference", "recorded_by", "created_at"]

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Invoice)
class InvoiceAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "organization",
        "period_start",
        "plan",
        "executions",
        "total_cents",
        "status",
        "paid_at",
    ]
    list_filter = ["status", "plan", "period_start"]
    search_fields = ["organization__slug"]
    list_select_related = ["organization"]
    readonly_fields = [
        "organization",
        "period_start",
        "period_end",
        "plan",
        "executions",
        "included_executions",
        "total_cents",
        "currency",
        "status",
        "issued_at",
        "paid_at",
        "voided_at",
    ]
    inlines = [InvoiceLineItemInline, PaymentInline]
    actions = ["mark_paid", "void"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Mark selected invoices paid (manual payment)")
    def mark_paid(self, request: HttpRequest, queryset: QuerySet[Invoice]) -> None:
        self._each(
            request,
            queryset,
            lambda inv: services.invoice_mark_paid(
                invoice=inv,
                recorded_by=signed_in_user(request),
                reference="admin",
            ),
            "paid",
        )

    @admin.action(description="Void selected invoices")
    def void(self, request: HttpRequest, queryset: QuerySet[Invoice]) -> None:
        self._each(request, queryset, lambda inv: services.invoice_void(invoice=inv), "voided")

    def _each(
        self,
        request: HttpRequest,
        queryset: QuerySet[Invoice],
        action: Callable[[Invoice], object],
        verb: str,
    ) -> None:
        done = 0
        for invoice in queryset:
            try:
                action(invoice)
                done += 1
            except ApplicationError as exc:
                self.message_user(request, f"Invoice {invoice.pk}: {exc.message}", messages.WARNING)
        self.message_user(request, f"{done} invoice(s) {verb}.")


@admin.register(Payment)
class PaymentAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "invoice",
        "amount_cents",
        "gateway",
        "reference",
        "recorded_by",
        "created_at",
    ]


@admin.register(IdempotencyRecord)
class IdempotencyRecordAdmin(ReadOnlyAdmin):
    list_display = ["organization", "key", "state", "status_code", "created_at", "completed_at"]
    search_fields = ["key", "organization__slug"]
    list_select_related = ["organization"]

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return True  # freeing a stuck key by hand is legitimate
