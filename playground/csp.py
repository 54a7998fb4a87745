"""Content-Security-Policy on every response that does not bring its own.

The app's pages load scripts only from our static files (no inline scripts or event handlers,
no CDN), so an injected `<script>` or `onerror=` does not run. Responses that set their own
policy keep it: the port-preview proxy sends `sandbox` for content from inside a sandbox, and
that stricter policy must not be replaced by ours.
"""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings


class ContentSecurityPolicyMiddleware:
    """Sync and async capable, and only sets a header, so it runs inline under ASGI."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):  # type: ignore[no-untyped-def]
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    @staticmethod
    def _apply(response):  # type: ignore[no-untyped-def]
        policy = settings.CONTENT_SECURITY_POLICY
        if policy and "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = policy
        return response

    def __call__(self, request):  # type: ignore[no-untyped-def]
        if iscoroutinefunction(self):
            return self.__acall__(request)
        return self._apply(self.get_response(request))

    async def __acall__(self, request):  # type: ignore[no-untyped-def]
        return self._apply(await self.get_response(request))
