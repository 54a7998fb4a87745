"""REST endpoints for usage, invoices, the plan and the spending cap. Thin: parse, authorize,
call one selector or service, render."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from typing import Any, cast

from django.http import HttpResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.pagination import BasePagination
from rest_framework.permissions import BasePermission
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from accounts.models import Organization
from accounts.permissions import (
    MACHINE_CREDENTIALS,
    HasOrganization,
    IsOrganizationManager,
    principal_of,
    signed_in_user,
)
from common.inputs import InputSerializer
from common.schema_shapes import PAGE_PARAMETERS, page_of

from . import api_schema, pricing, selectors, services
from .api_schema import LineOutput
from .models import Invoice

# A spreadsheet treats a cell starting with one of these as a formula (=HYPERLINK(...) can
# exfiltrate the sheet); API key names are chosen by users, so such cells get a leading quote.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_safe_cell(value: object) -> object:
    """`value`, with text that a spreadsheet would run as a formula prefixed by a single quote."""
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS):
        return "'" + value
    return value


class CsvRenderer(BaseRenderer):
    """Lets `?format=csv` and `usage.csv` through content negotiation; errors stay JSON."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(
        self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None
    ) -> bytes:
        if isinstance(data, bytes | str):
            return data.encode() if isinstance(data, str) else data
        return json.dumps(data).encode()


class JsonErrorsMixin:
    """Render error responses as JSON even when CSV was negotiated."""

    def finalize_response(
        self, request: Request, response: Response, *args: Any, **kwargs: Any
    ) -> Response:
        if isinstance(response, Response) and response.status_code >= 400:
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = JSONRenderer.media_type
        # A mixin: APIView, later in the views' bases, has the method.
        return super().finalize_response(request, response, *args, **kwargs)  # type: ignore[misc]


class IsStaffUser(BasePermission):
    """A signed-in staff user (browser session). API keys and sandbox tokens never are."""

    message = "Only Sandpit staff can do this."
    refused_credentials = MACHINE_CREDENTIALS

    def has_permission(self, request: Request, view: APIView) -> bool:
        user = getattr(request, "user", None)
        return bool(user is not None and user.is_authenticated and getattr(user, "is_staff", False))


class InvoiceOutput(serializers.ModelSerializer):
    lines = LineOutput(many=True)
    total = serializers.SerializerMethodField()

    class Meta:
        model = Invoice
        fields = [
            "id",
            "period_start",
            "period_end",
            "plan",
            "executions",
            "included_executions",
            "total_cents",
            "total",
            "currency",
            "status",
            "issued_at",
            "paid_at",
            "voided_at",
            "lines",
        ]

    def get_total(self, obj: Invoice) -> str:
        return pricing.format_cents(obj.total_cents)


class UsageApi(JsonErrorsMixin, APIView):
    """GET usage of the current period (JSON), or ?format=csv / usage.csv for the export."""

    permission_classes = [HasOrganization]
    renderer_classes = [JSONRenderer, CsvRenderer]

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "format", str, enum=["json", "csv"], description="csv: the export (default json)."
            )
        ],
        responses={
            (200, "application/json"): api_schema.UsageOutput,
            (200, "text/csv"): OpenApiTypes.STR,
        },
    )
    def get(self, request: Request, format: str | None = None) -> HttpResponse:
        organization = principal_of(request).organization
        if request.accepted_renderer.format == "csv":
            return self._csv(organization)
        usage = selectors.usage_summary(organization=organization)
        return Response(
            {
                "period_start": usage.period_start,
                "period_end": usage.period_end,
                "plan": usage.plan,
                "executions": usage.executions,
                "included_executions": usage.included_executions,
                "remaining_included_executions": max(
                    0, usage.included_executions - usage.executions
                ),
                "amount_so_far_cents": usage.amount_so_far_cents,
                "projected_executions": usage.projected_executions,
                "projected_cents": usage.projected_cents,
                "projection_available": usage.projection_available,
                "projection_note": usage.projection_note,
                "spending_cap_cents": usage.spending_cap_cents,
                "by_day": [{"day": day, "executions": n} for day, n in usage.by_day],
                "by_key": [
                    {"api_key_id": k.api_key_id, "name": k.name, "executions": k.executions}
                    for k in usage.by_key
                ],
            }
        )

    def _csv(self, organization: Organization) -> HttpResponse:
        start = pricing.period_start(timezone.now())
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(["day", "api_key_id", "api_key_name", "executions"])
        for day, key_id, name, count in selectors.usage_rows(
            organization=organization, start=start
        ):
            writer.writerow(
                [csv_safe_cell(c) for c in (day.isoformat(), key_id or "", name, count)]
            )
        response = HttpResponse(buffer.getvalue(), content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="usage-{start:%Y-%m}.csv"'
        return response


class InvoiceListApi(APIView):
    permission_classes = [HasOrganization]

    @extend_schema(
        operation_id="v1_invoices_list",
        responses=page_of("Invoice", InvoiceOutput(many=True)),
        parameters=PAGE_PARAMETERS,
    )
    def get(self, request: Request) -> Response:
        invoices = selectors.invoices_for_org(organization=principal_of(request).organization)
        # DRF imports the configured dotted path; the stubs type the setting as that string.
        paginator_class = cast(type[BasePagination], api_settings.DEFAULT_PAGINATION_CLASS)
        paginator = paginator_class()
        page = paginator.paginate_queryset(invoices, request, view=self)
        return paginator.get_paginated_response(InvoiceOutput(page, many=True).data)


class InvoiceDetailApi(APIView):
    permission_classes = [HasOrganization]

    @extend_schema(responses=InvoiceOutput)
    def get(self, request: Request, invoice_id: int) -> Response:
        invoice = selectors.invoice_get_for_org(
            organization=principal_of(request).organization, invoice_id=invoice_id
        )
        return Response(InvoiceOutput(invoice).data)


def _quote_lines(quote: pricing.Quote) -> list[dict[str, Any]]:
    return [LineOutput(line).data for line in quote.lines]


class InvoiceUpcomingApi(APIView):
    """The current period's invoice as it stands now, and projected to the period's end."""

    permission_classes = [HasOrganization]

    @extend_schema(responses=api_schema.UpcomingInvoiceOutput)
    def get(self, request: Request) -> Response:
        upcoming = selectors.invoice_upcoming(organization=principal_of(request).organization)
        return Response(
            {
                "period_start": upcoming.period_start,
                "period_end": upcoming.period_end,
                "plan": upcoming.plan,
                "executions": upcoming.executions,
                "total_cents": upcoming.quote.total_cents,
                "total": pricing.format_cents(upcoming.quote.total_cents),
                "lines": _quote_lines(upcoming.quote),
                "projected": {
                    "executions": upcoming.projected.executions,
                    "total_cents": upcoming.projected.total_cents,
                    "lines": _quote_lines(upcoming.projected),
                    "available": upcoming.projection_available,
                    "note": upcoming.projection_note,
                },
            }
        )


class InvoiceMarkPaidApi(APIView):
    """Staff only: record that an invoice was paid outside Sandpit."""

    permission_classes = [IsStaffUser]

    class InvoiceMarkPaidInput(InputSerializer):
        reference = serializers.CharField(
            max_length=200,
            required=False,
            allow_blank=True,
            default="",
            help_text="The payment's reference outside Sandpit (a transfer id, a receipt).",
        )

    @extend_schema(request=InvoiceMarkPaidInput, responses=InvoiceOutput)
    def post(self, request: Request, invoice_id: int) -> Response:
        data = self.InvoiceMarkPaidInput(data=request.data)
        data.is_valid(raise_exception=True)
        invoice = selectors.invoice_get(invoice_id=invoice_id)
        services.invoice_mark_paid(
            invoice=invoice,
            recorded_by=signed_in_user(request),
            reference=data.validated_data["reference"],
        )
        return Response(InvoiceOutput(invoice).data)


def _plan_body(state: services.PlanState) -> dict[str, Any]:
    return {
        "plan": state.plan,
        "scheduled_plan": state.scheduled_plan,
        "scheduled_at": state.scheduled_at,
    }


class PlanApi(APIView):
    """GET the plan (and any scheduled change); POST {"plan"} to change it (owners/admins)."""

    class PlanInput(InputSerializer):
        plan = serializers.ChoiceField(
            choices=list(pricing.PLANS),
            help_text="The plan to change to (an upgrade applies now, a downgrade at the "
            "period's end).",
        )

    def get_permissions(self) -> Sequence[BasePermission]:
        return [HasOrganization()] if self.request.method == "GET" else [IsOrganizationManager()]

    @extend_schema(responses=api_schema.PlanOutput)
    def get(self, request: Request) -> Response:
        return Response(
            _plan_body(services.plan_state(organization=principal_of(request).organization))
        )

    @extend_schema(request=PlanInput, responses=api_schema.PlanOutput)
    def post(self, request: Request) -> Response:
        data = self.PlanInput(data=request.data)
        data.is_valid(raise_exception=True)
        principal = principal_of(request)
        state = services.organization_plan_change(
            organization=principal.organization,
            plan=data.validated_data["plan"],
            requested_by=principal.user,
        )
        return Response(_plan_body(state))


class SpendingCapApi(APIView):
    """PUT {"cap_cents": int|null}: the hard cap on a period's invoice total (owners/admins)."""

    permission_classes = [IsOrganizationManager]

    class SpendingCapInput(InputSerializer):
        cap_cents = serializers.IntegerField(
            min_value=0,
            max_value=10**12,
            allow_null=True,
            help_text="The most a period's invoice may reach, in cents; null for no cap.",
        )

    @extend_schema(request=SpendingCapInput, responses=api_schema.SpendingCapOutput)
    def put(self, request: Request) -> Response:
        data = self.SpendingCapInput(data=request.data)
        data.is_valid(raise_exception=True)
        organization = principal_of(request).organization
        services.organization_spending_cap_set(
            organization=organization, cap_cents=data.validated_data["cap_cents"]
        )
        return Response({"cap_cents": organization.spending_cap_cents})
