"""URLs for tests/playground/test_web_threads.py: views that block on the test's events."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Awaitable, Callable

from asgiref.sync import markcoroutinefunction, sync_to_async
from django.db import connections
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    JsonResponse,
    StreamingHttpResponse,
)
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


def database(request: HttpRequest) -> JsonResponse:
    """Whether this thread held a database connection when the view began, then a query."""
    wrapper = connections["default"]  # this thread's own (django.db.connection is a proxy)
    open_at_start = wrapper.connection is not None
    with wrapper.cursor() as cursor:
        cursor.execute("SELECT 1")
    OPENED.append(wrapper)
    return JsonResponse({"thread": threading.get_ident(), "open_at_start": open_at_start})


def hold_database(request: HttpRequest) -> HttpResponse:
    """`database`, then `hold`: a view still holding its connection when cancelled."""
    database(request)
    return hold(request)


def stream_database(request: HttpRequest) -> StreamingHttpResponse:
    """`database`'s query, then a streamed body: the view's thread."""
    database(request)
    ident = str(threading.get_ident()).encode()

    async def chunks() -> AsyncIterator[bytes]:
        yield ident

    return StreamingHttpResponse(chunks())


def fails(request: HttpRequest) -> HttpResponse:
    raise ValueError("a bug in the view")


def query_on_the_request_thread() -> None:
    wrapper = connections["default"]
    with wrapper.cursor() as cursor:
        cursor.execute("SELECT 1")
    OPENED.append(wrapper)


class QueryAfterTheView:
    """Middleware that queries the database on the request's thread after the view, as a
    session saved on the way out does."""

    async_capable = True
    sync_capable = False

    def __init__(self, get_response: Callable[[HttpRequest], Awaitable[HttpResponseBase]]):
        self.get_response = get_response
        markcoroutinefunction(self)  # Django tells async middleware by this mark

    async def __call__(self, request: HttpRequest) -> HttpResponseBase:
        response = await self.get_response(request)
        await sync_to_async(query_on_the_request_thread)()
        return response


OPENED: list = []
"""The connection objects (one per thread) that `database` used, for the test to inspect."""

urlpatterns = [
    path("meet", meet),
    path("ident", ident),
    path("hold", hold),
    path("database", database),
    path("hold-database", hold_database),
    path("stream-database", stream_database),
    path("fails", fails),
]
