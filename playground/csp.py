"""Content-Security-Policy on every response that does not bring its own.

The app's pages load scripts only from our static files (no inline scripts or event handlers,
no CDN), so an injected `<script>` or `onerror=` does not run. Responses that set their own
policy keep it: the port-preview proxy sends `sandbox` for content from inside a sandbox, and
that stricter policy must not be replaced by ours.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import cast

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.http import HttpRequest
from django.http.response import HttpResponseBase

from .middleware import AsyncGetResponse, GetResponse


class ContentSecurityPolicyMiddleware:
    """Sync and async capable, and only sets a header, so it runs inline under ASGI."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: GetResponse) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    @staticmethod
    def _apply(response: HttpResponseBase) -> HttpResponseBase:
        policy = settings.CONTENT_SECURITY_POLICY
        if policy and "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = policy
        return response

    def __call__(self, request: HttpRequest) -> HttpResponseBase | Awaitable[HttpResponseBase]:
        is_async = iscoroutinefunction(self)  # a bool: no narrowing of self to a coroutine
        if is_async:
            return self.__acall__(request)
        # A sync chain returns responses.
        return self._apply(cast(HttpResponseBase, self.get_response(request)))

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        # Only called when __init__ found get_response to be a coroutine function.
        return self._apply(await cast(AsyncGetResponse, self.get_response)(request))
