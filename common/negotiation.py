"""Content negotiation with a shortcut for the Accept header almost every API client sends.

curl, httpx, requests and the SDK send `Accept: */*` (or none). DRF's negotiation then
parses that header into media types and orders them by precedence on every request, only
to pick the first renderer: 0.05-0.1 ms of a 2 ms API read. Here that case picks the first
renderer directly, as DRF would; every other header (and ?format=) goes to DRF's own
negotiation, 406 included. An empty or repeated `?format=` is a 400 here (DRF would
ignore it and answer JSON, so a typo in a script reads as success)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request

from common.errors import ApplicationError

ANY_MEDIA_TYPE = "*/*"


class AnyFirstNegotiation(DefaultContentNegotiation):
    def select_renderer(
        self,
        request: Request,
        renderers: Iterable[BaseRenderer],
        format_suffix: str | None = None,
    ) -> Any:
        renderers = list(renderers)
        accept = request.META.get("HTTP_ACCEPT", ANY_MEDIA_TYPE)
        if (
            accept == ANY_MEDIA_TYPE
            and renderers
            and not format_suffix
            and not request.META.get("QUERY_STRING")
        ):
            first = renderers[0]
            return first, first.media_type
        formats = request.query_params.getlist(self.settings.URL_FORMAT_OVERRIDE or "format")
        if formats and (len(formats) > 1 or not formats[0]):
            raise ApplicationError(
                "format takes one value: json (csv where an endpoint offers it).",
                code="validation_error",
            )
        return super().select_renderer(request, renderers, format_suffix)
