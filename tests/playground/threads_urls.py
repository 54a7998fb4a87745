"""URLs for tests/playground/test_web_threads.py: views that block on the test's events."""

from __future__ import annotations

import threading

from django.http import HttpRequest, HttpResponse
from django.urls import path

BARRIER = threading.Barrier(2, timeout=20)
RELEASE = threading.Event()
ENTERED = threading.Event()
LEFT = threading.Event()


def meet(request: HttpRequest) -> HttpResponse:
    """Returns only once another request is inside this view at the same time."""
    BARRIER.wait()
    return HttpResponse(str(threading.get_ident()))


def ident(request: HttpRequest) -> HttpResponse:
    return HttpResponse(str(threading.get_ident()))


def hold(request: HttpRequest) -> HttpResponse:
    ENTERED.set()
    RELEASE.wait(20)
    LEFT.set()
    return HttpResponse(str(threading.get_ident()))


urlpatterns = [
    path("meet", meet),
    path("ident", ident),
    path("hold", hold),
]
