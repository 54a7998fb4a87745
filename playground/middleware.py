"""Request ids (accepted from X-Request-ID or generated, echoed back, put in every log line),
and Django's built-in middleware adapted to run without thread hops under ASGI."""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Awaitable, Callable
from contextvars import Token
from typing import cast

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.contrib.auth import middleware as auth_middleware
from django.contrib.messages import middleware as message_middleware
from django.contrib.sessions import middleware as session_middleware
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.middleware import clickjacking, common, csrf, security
from django.utils.deprecation import MiddlewareMixin

from common.logging import request_id_var

_SAFE_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class RequestIds:
    """Request ids unique across processes without a system call each: 16 random hex digits
    drawn once per process (again in a forked child), then a counter. A uuid4 per request
    read os.urandom, which lets go of the GIL: on the event loop's thread, under load, each
    request then waited for a request thread to hand the GIL back."""

    def __init__(self) -> None:
        self._restart()
        os.register_at_fork(after_in_child=self._restart)

    def _restart(self) -> None:
        self._prefix = os.urandom(8).hex()
        self._counter = itertools.count()

    def next(self) -> str:
        return f"{self._prefix}{next(self._counter):016x}"


REQUEST_IDS = RequestIds()

GetResponse = Callable[[HttpRequest], HttpResponseBase | Awaitable[HttpResponseBase]]
AsyncGetResponse = Callable[[HttpRequest], Awaitable[HttpResponseBase]]


def _awaiting(get_response: object) -> AsyncGetResponse:
    """get_response as the coroutine function it is whenever __acall__ runs: Django (and
    RequestIdMiddleware) take the async path only when the next layer is async."""
    return cast(AsyncGetResponse, get_response)


class RequestIdMiddleware:
    """Sync and async capable, so under ASGI the middleware chain stays async and a request
    crosses to a thread once (for the view), not at every sync-only middleware."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: GetResponse) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def _begin(self, request: HttpRequest) -> tuple[str, Token[str]]:
        incoming = request.headers.get("X-Request-ID", "")
        request_id = incoming if _SAFE_ID.match(incoming) else REQUEST_IDS.next()
        request.request_id = request_id  # type: ignore[attr-defined]  # our own request attribute
        return request_id, request_id_var.set(request_id)

    def __call__(self, request: HttpRequest) -> HttpResponseBase | Awaitable[HttpResponseBase]:
        is_async = iscoroutinefunction(self)  # a bool: no narrowing of self to a coroutine
        if is_async:
            return self.__acall__(request)
        request_id, token = self._begin(request)
        try:
            response = self.get_response(request)
        finally:
            request_id_var.reset(token)
        response = cast(HttpResponseBase, response)  # a sync chain returns responses
        response["X-Request-ID"] = request_id
        return response

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        request_id, token = self._begin(request)
        try:
            response = await _awaiting(self.get_response)(request)
        finally:
            request_id_var.reset(token)
        response["X-Request-ID"] = request_id
        return response


# --- Django's built-in middleware, without a thread hop per hook ------------------------------
#
# Under ASGI, Django runs a MiddlewareMixin's process_request and process_response each through
# sync_to_async: two thread round trips per middleware, about 1.2 ms a request here for the
# seven below (measured with daphne). Their hooks only read the request and set headers, so
# these subclasses run them on the event loop; the two that can reach the database (a session
# that was read or written, messages that were used) still hop to a thread, only then. A hook
# that did touch the database here would fail loudly (SynchronousOnlyOperation), not silently.


class _InlineHooks(MiddlewareMixin):
    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        response: HttpResponseBase | None = None
        if hasattr(self, "process_request"):
            response = self.process_request(request)
        response = response or await _awaiting(self.get_response)(request)
        if hasattr(self, "process_response"):
            response = self.process_response(request, response)
        return response


class SecurityMiddleware(_InlineHooks, security.SecurityMiddleware):
    pass


class CommonMiddleware(_InlineHooks, common.CommonMiddleware):
    pass


class XFrameOptionsMiddleware(_InlineHooks, clickjacking.XFrameOptionsMiddleware):
    pass


class AuthenticationMiddleware(_InlineHooks, auth_middleware.AuthenticationMiddleware):
    """Only installs the lazy `request.user`; loading it happens in the view's thread."""


SAFE_METHODS = ("GET", "HEAD", "OPTIONS", "TRACE")


class CsrfViewMiddleware(_InlineHooks, csrf.CsrfViewMiddleware):
    """The cookie is read and set inline; the view check hops to a thread only when it may
    parse a form body (an unsafe method on a view that is not csrf_exempt).

    A safe method is accepted the way Django's process_view accepts it (mark the request
    checked, let the view run); tests/playground/test_asgi_middleware.py compares the two so
    a Django upgrade that changes it fails there."""

    async def process_view(  # type: ignore[override]  # async here; Django calls it either way
        self,
        request: HttpRequest,
        callback: Callable[..., HttpResponseBase],
        callback_args: tuple[object, ...],
        callback_kwargs: dict[str, object],
    ) -> HttpResponseBase | None:
        if getattr(request, "csrf_processing_done", False) or getattr(
            callback, "csrf_exempt", False
        ):
            return None
        if request.method in SAFE_METHODS:
            request.csrf_processing_done = True  # type: ignore[attr-defined]  # Django's marker
            return None
        return await sync_to_async(super().process_view)(
            request, callback, callback_args, callback_kwargs
        )


class SessionMiddleware(_InlineHooks, session_middleware.SessionMiddleware):
    """Creating the lazy session is inline; saving it hops to a thread if it was touched."""

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        self.process_request(request)
        response = await _awaiting(self.get_response)(request)
        # The stubs type process_response's response as HttpResponse; Django takes any response.
        if request.session.accessed or request.session.modified:
            return await sync_to_async(self.process_response)(request, response)  # type: ignore[arg-type]
        return self.process_response(request, response)  # type: ignore[arg-type]


class MessageMiddleware(_InlineHooks, message_middleware.MessageMiddleware):
    """Messages live in the session or a cookie; storing them hops only if any were used."""

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        self.process_request(request)
        response = await _awaiting(self.get_response)(request)
        storage = request._messages  # type: ignore[attr-defined]  # set by process_request
        # The stubs type process_response's response as HttpResponse; Django takes any response.
        if storage.used or storage.added_new:
            return await sync_to_async(self.process_response)(request, response)  # type: ignore[arg-type]
        return self.process_response(request, response)  # type: ignore[arg-type]
