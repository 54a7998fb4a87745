"""Request ids (accepted from X-Request-ID or generated, echoed back, put in every log line),
and Django's built-in middleware adapted to run without thread hops under ASGI."""

from __future__ import annotations

import re
import uuid

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.contrib.auth import middleware as auth_middleware
from django.contrib.messages import middleware as message_middleware
from django.contrib.sessions import middleware as session_middleware
from django.middleware import clickjacking, common, csrf, security

from .logging import request_id_var

_SAFE_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class RequestIdMiddleware:
    """Sync and async capable, so under ASGI the middleware chain stays async and a request
    crosses to a thread once (for the view), not at every sync-only middleware."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):  # type: ignore[no-untyped-def]
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def _begin(self, request):  # type: ignore[no-untyped-def]
        incoming = request.headers.get("X-Request-ID", "")
        request.request_id = incoming if _SAFE_ID.match(incoming) else uuid.uuid4().hex
        return request_id_var.set(request.request_id)

    def __call__(self, request):  # type: ignore[no-untyped-def]
        if iscoroutinefunction(self):
            return self.__acall__(request)
        token = self._begin(request)
        try:
            response = self.get_response(request)
        finally:
            request_id_var.reset(token)
        response["X-Request-ID"] = request.request_id
        return response

    async def __acall__(self, request):  # type: ignore[no-untyped-def]
        token = self._begin(request)
        try:
            response = await self.get_response(request)
        finally:
            request_id_var.reset(token)
        response["X-Request-ID"] = request.request_id
        return response


# --- Django's built-in middleware, without a thread hop per hook ------------------------------
#
# Under ASGI, Django runs a MiddlewareMixin's process_request and process_response each through
# sync_to_async: two thread round trips per middleware, about 1.2 ms a request here for the
# seven below (measured with daphne). Their hooks only read the request and set headers, so
# these subclasses run them on the event loop; the two that can reach the database (a session
# that was read or written, messages that were used) still hop to a thread, only then. A hook
# that did touch the database here would fail loudly (SynchronousOnlyOperation), not silently.


class _InlineHooks:
    async def __acall__(self, request):  # type: ignore[no-untyped-def]
        response = self.process_request(request) if hasattr(self, "process_request") else None
        response = response or await self.get_response(request)  # type: ignore[attr-defined]
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


class CsrfViewMiddleware(_InlineHooks, csrf.CsrfViewMiddleware):
    """The cookie is read and set inline; the view check hops to a thread only when it may
    parse a form body (an unsafe method on a view that is not csrf_exempt)."""

    async def process_view(self, request, callback, callback_args, callback_kwargs):  # type: ignore[no-untyped-def]
        if getattr(request, "csrf_processing_done", False) or getattr(
            callback, "csrf_exempt", False
        ):
            return None
        if request.method in ("GET", "HEAD", "OPTIONS", "TRACE"):
            return self._accept(request)
        return await sync_to_async(super().process_view)(
            request, callback, callback_args, callback_kwargs
        )


class SessionMiddleware(_InlineHooks, session_middleware.SessionMiddleware):
    """Creating the lazy session is inline; saving it hops to a thread if it was touched."""

    async def __acall__(self, request):  # type: ignore[no-untyped-def]
        self.process_request(request)
        response = await self.get_response(request)
        if request.session.accessed or request.session.modified:
            return await sync_to_async(self.process_response)(request, response)
        return self.process_response(request, response)


class MessageMiddleware(_InlineHooks, message_middleware.MessageMiddleware):
    """Messages live in the session or a cookie; storing them hops only if any were used."""

    async def __acall__(self, request):  # type: ignore[no-untyped-def]
        self.process_request(request)
        response = await self.get_response(request)
        storage = request._messages
        if storage.used or storage.added_new:
            return await sync_to_async(self.process_response)(request, response)
        return self.process_response(request, response)
