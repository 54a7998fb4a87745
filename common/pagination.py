from __future__ import annotations

from rest_framework.pagination import LimitOffsetPagination


class CursorlessPagination(LimitOffsetPagination):
    """?limit=&offset= with {"count", "next", "previous", "results"}."""

    default_limit = 50
    max_limit = 500
