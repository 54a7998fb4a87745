"""Content negotiation with a shortcut for the Accept header almost every API client sends.

curl, httpx, requests and the SDK send `Accept: */*` (or none). DRF's negotiation then
parses that header into media types and orders them by precedence on every request, only
to pick the first renderer: 0.05-0.1 ms of a 2 ms API read. Here that case picks the first
renderer directly, as DRF would; every other header (and ?format=) goes to DRF's own
negotiation, 406 included. A `?format=` that is empty, repeated, not one this endpoint
renders or not the one its path's suffix names is a 400 here (DRF would ignore the first
and the last and answer anyway, so a typo in a script reads as success, and answer the
third 404)."""

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
        offered = [renderer.format for renderer in renderers]
        if formats and (
            len(formats) > 1
            or formats[0] not in offered
            or (format_suffix and formats[0] != format_suffix)
        ):
            raise ApplicationError(
                f"format takes one value, here {' or '.join(offered)}"
                + (f" (as the path's .{format_suffix} says)." if format_suffix else "."),
                code="validation_error",
            )
        return super().select_renderer(request, renderers, format_suffix)
