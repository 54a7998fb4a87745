"""What the billing API's OpenAPI schema says of the answers its views build as dicts:
declarations for the schema (but `LineOutput`, which also renders invoice and quote lines).
tests/playground/test_api_fuzz.py holds the answers to them."""

from __future__ import annotations

from rest_framework import serializers

from . import pricing

PLAN_HELP = f"One of {', '.join(pricing.PLANS)}."


class LineOutput(serializers.Serializer):
    kind = serializers.CharField()
    description = serializers.CharField()
    quantity = serializers.IntegerField()
    unit_price_cents = serializers.DecimalField(max_digits=12, decimal_places=4)
    amount_cents = serializers.IntegerField()


class ProjectedOutput(serializers.Serializer):
    executions = serializers.IntegerField(help_text="At the current rate, by the period's end.")
    total_cents = serializers.IntegerField()
    lines = LineOutput(many=True)
    available = serializers.BooleanField(help_text="false early in a period: too little to go on.")
    note = serializers.CharField(allow_blank=True)


class UpcomingInvoiceOutput(serializers.Serializer):
    period_start = serializers.DateField()
    period_end = serializers.DateField()
    plan = serializers.CharField(help_text=PLAN_HELP)
    executions = serializers.IntegerField()
    total_cents = serializers.IntegerField(help_text="As it stands now.")
    total = serializers.CharField(help_text="total_cents formatted, e.g. $97.00.")
    lines = LineOutput(many=True)
    projected = ProjectedOutput()


class DayUsageOutput(serializers.Serializer):
    day = serializers.DateField()
    executions = serializers.IntegerField()


class KeyUsageOutput(serializers.Serializer):
    api_key_id = serializers.IntegerField(allow_null=True, help_text="null: browser sessions.")
    name = serializers.CharField()
    executions = serializers.IntegerField()


class UsageOutput(serializers.Serializer):
    period_start = serializers.DateField()
    period_end = serializers.DateField()
    plan = serializers.CharField(help_text=PLAN_HELP)
    executions = serializers.IntegerField()
    included_executions = serializers.IntegerField()
    remaining_included_executions = serializers.IntegerField()
    amount_so_far_cents = serializers.IntegerField()
    projected_executions = serializers.IntegerField()
    projected_cents = serializers.IntegerField()
    projection_available = serializers.BooleanField()
    projection_note = serializers.CharField(allow_blank=True)
    spending_cap_cents = serializers.IntegerField(allow_null=True)
    by_day = DayUsageOutput(many=True)
    by_key = KeyUsageOutput(many=True)


class PlanOutput(serializers.Serializer):
    plan = serializers.CharField(help_text=PLAN_HELP)
    scheduled_plan = serializers.CharField(allow_null=True, help_text="A downgrade waiting.")
    scheduled_at = serializers.DateTimeField(allow_null=True, help_text="When it applies.")


class SpendingCapOutput(serializers.Serializer):
    cap_cents = serializers.IntegerField(allow_null=True, help_text="null: no cap.")
