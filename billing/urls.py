from django.urls import path

from . import apis

urlpatterns = [
    path("usage", apis.UsageApi.as_view(), name="api-usage"),
    path("usage.csv", apis.UsageApi.as_view(), {"format": "csv"}, name="api-usage-csv"),
    path("invoices", apis.InvoiceListApi.as_view(), name="api-invoices"),
    path("invoices/upcoming", apis.InvoiceUpcomingApi.as_view(), name="api-invoice-upcoming"),
    path("invoices/<int:invoice_id>", apis.InvoiceDetailApi.as_view(), name="api-invoice"),
    path(
        "invoices/<int:invoice_id>/mark-paid",
        apis.InvoiceMarkPaidApi.as_view(),
        name="api-invoice-mark-paid",
    ),
    path("billing/plan", apis.PlanApi.as_view(), name="api-billing-plan"),
    path("billing/spending-cap", apis.SpendingCapApi.as_view(), name="api-billing-spending-cap"),
]
