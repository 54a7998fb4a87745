"""Payment gateways behind one small interface.

A gateway is chosen by the SANDPIT_PAYMENT_GATEWAY setting (a dotted path; default the
manual gateway). The manual gateway collects nothing: staff mark invoices paid by hand
when the money arrives (the "mark paid" API and admin action).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from django.conf import settings
from django.utils.module_loading import import_string

if TYPE_CHECKING:
    from .models import Invoice


@dataclass(frozen=True)
class ChargeResult:
    """What a gateway did with an invoice."""

    status: Literal["succeeded", "pending", "failed"]
    """succeeded = money taken (the invoice is marked paid); pending = wait; failed = declined."""
    gateway: str
    reference: str = ""
    """The gateway's id for the charge, kept on the Payment."""


class PaymentGateway(Protocol):
    name: str

    def charge(self, *, invoice: Invoice) -> ChargeResult:
        """Try to collect `invoice.total_cents`. Must be safe to call twice for one invoice."""
        ...


class ManualGateway:
    """Invoices are paid outside Sandpit (bank transfer, card terminal); staff record it."""

    name = "manual"

    def charge(self, *, invoice: Invoice) -> ChargeResult:
        return ChargeResult(status="pending", gateway=self.name)


def get_payment_gateway() -> PaymentGateway:
    path = getattr(settings, "SANDPIT_PAYMENT_GATEWAY", "billing.payments.ManualGateway")
    gateway: PaymentGateway = import_string(path)()
    return gateway
