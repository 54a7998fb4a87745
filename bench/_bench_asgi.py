"""The product's ASGI application plus one bare endpoint, GET /bench/hello, for benchmarks
only: a sync Django view behind the same server, ASGI handler and middleware as every API
request, with no authentication, database or provider. It is the floor an API read that
touches no provider is compared with (bench_api_read.py); the product's URLs never hold it."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse

from playground.asgi import application  # noqa: F401 - served by daphne
from playground.urls import urlpatterns


def hello(request: HttpRequest) -> HttpResponse:
    return HttpResponse(b"hello", content_type="text/plain")


from django.urls import clear_url_caches, path  # noqa: E402

urlpatterns.insert(0, path("bench/hello", hello))
clear_url_caches()
