"""The API's one JSON parser: DRF's, with nesting bounded so hostile bodies answer 400."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rest_framework import parsers
from rest_framework.exceptions import ParseError

# Deep enough for any real metadata, shallow enough that nothing that walks a body
# recursively later (validation, the JSON column, rendering) can exhaust the stack.
MAX_JSON_DEPTH = 64


class JSONParser(parsers.JSONParser):
    """Refuses bodies nested deeper than MAX_JSON_DEPTH. The C decoder raises
    RecursionError on about a thousand levels; that, too, is a malformed request."""

    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(_too_deep()) from None
        if _depth_exceeds(data, MAX_JSON_DEPTH):
            raise ParseError(_too_deep())
        return data


def _too_deep() -> str:
    return f"JSON parse error - nested deeper than {MAX_JSON_DEPTH} levels."


def _depth_exceeds(value: Any, limit: int) -> bool:
    """Whether arrays and objects nest more than `limit` deep (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children: Iterable[Any]
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False
