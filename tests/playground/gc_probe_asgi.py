"""The product's ASGI application plus two probes of the serving process, for
tests/playground/test_web_heap.py only: GET /test/gc-state (the collector's state) and
GET /test/request-started (whether Django's request_started signal has receivers)."""

from __future__ import annotations

import gc

from django.core import signals
from django.http import HttpRequest, JsonResponse
from django.urls import clear_url_caches, get_resolver, path

from playground.asgi import application
from playground.urls import urlpatterns


def gc_state(request: HttpRequest) -> JsonResponse:
    resolver = get_resolver()
    return JsonResponse(
        {
            "frozen": gc.get_freeze_count(),
            "threshold": list(gc.get_threshold()),
            # Made at startup (the ready callable loads the URL configuration), else by the
            # first request, after the freeze.
            "resolver_frozen": not any(resolver is obj for obj in gc.get_objects()),
        }
    )


def request_started(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"listeners": signals.request_started.has_listeners()})


urlpatterns.insert(0, path("test/gc-state", gc_state))
urlpatterns.insert(0, path("test/request-started", request_started))
clear_url_caches()

__all__ = ["application"]
