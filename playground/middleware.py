"""Request ids: accepted from X-Request-ID or generated, echoed back, put in every log line."""

from __future__ import annotations

import re
import uuid

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

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
