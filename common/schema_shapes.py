"""The OpenAPI shapes of the API's list answers, declared once for every list view.

Lists answer an object, never a bare array: `{"results": [...]}`, or, where the list is
paged (`?limit=&offset=`, common/pagination.py), that with `count`, `next` and `previous`."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, inline_serializer
from rest_framework import serializers

from common.pagination import MAX_OFFSET, CursorlessPagination

PAGE_PARAMETERS = [
    OpenApiParameter(
        "limit",
        {"type": "integer", "minimum": 1},
        description=f"At most this many results (default {CursorlessPagination.default_limit}, "
        f"more reads as {CursorlessPagination.max_limit}).",
    ),
    OpenApiParameter(
        "offset",
        {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET},
        description="Skip this many results first (default 0).",
    ),
]


def results_of(name: str, items: serializers.Serializer) -> serializers.Serializer:
    """`{"results": items}`; `items` is the item serializer with many=True."""
    return inline_serializer(name=f"{name}Results", fields={"results": items})


def page_of(name: str, items: serializers.Serializer) -> serializers.Serializer:
    """One page: `{"count", "next", "previous", "results"}`."""
    return inline_serializer(
        name=f"{name}Page",
        fields={
            "count": serializers.IntegerField(help_text="How many there are in all."),
            "next": serializers.URLField(allow_null=True, help_text="The next page, if any."),
            "previous": serializers.URLField(
                allow_null=True, help_text="The previous page, if any."
            ),
            "results": items,
        },
    )
