"""The product's settings with Django's stock middleware in place of the inline subclasses
of playground/middleware.py, for bench_api_read.py --stock-middleware: under ASGI each stock
MiddlewareMixin hook runs through sync_to_async, and this measures what that costs beside
the product's own chain in the same run."""

from __future__ import annotations

from playground.settings import *  # noqa: F403
from playground.settings import MIDDLEWARE as PRODUCT_MIDDLEWARE

STOCK = {
    "playground.middleware.SecurityMiddleware": "django.middleware.security.SecurityMiddleware",
    "playground.middleware.SessionMiddleware": (
        "django.contrib.sessions.middleware.SessionMiddleware"
    ),
    "playground.middleware.CommonMiddleware": "django.middleware.common.CommonMiddleware",
    "playground.middleware.CsrfViewMiddleware": "django.middleware.csrf.CsrfViewMiddleware",
    "playground.middleware.AuthenticationMiddleware": (
        "django.contrib.auth.middleware.AuthenticationMiddleware"
    ),
    "playground.middleware.MessageMiddleware": (
        "django.contrib.messages.middleware.MessageMiddleware"
    ),
    "playground.middleware.XFrameOptionsMiddleware": (
        "django.middleware.clickjacking.XFrameOptionsMiddleware"
    ),
}
# Ours, not a subclass of Django's: kept as they are.
OWN = {"playground.middleware.RequestIdMiddleware"}

_unmapped = [
    entry
    for entry in PRODUCT_MIDDLEWARE
    if entry.startswith("playground.middleware.") and entry not in STOCK and entry not in OWN
]
if _unmapped:  # a new inline subclass: say which stock class it stands for
    raise RuntimeError(f"bench/_bench_settings_stock.py: no stock class for {_unmapped}")
MIDDLEWARE = [STOCK.get(entry, entry) for entry in PRODUCT_MIDDLEWARE]
