"""The product's ASGI application plus GET /test/gc-state, which reports the collector's
state in the serving process, for tests/playground/test_web_heap.py only."""

from __future__ import annotations

import gc

from django.http import HttpRequest, JsonResponse
from django.urls import clear_url_caches, path

from playground.asgi import application
from playground.urls import urlpatterns


def gc_state(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"frozen": gc.get_freeze_count(), "threshold": list(gc.get_threshold())})


urlpatterns.insert(0, path("test/gc-state", gc_state))
clear_url_caches()

__all__ = ["application"]
