"""The one reader of clients' JSON: DRF's parser for the API and the WebSockets' frames.

What Python's json would read but no handler can use is refused: nesting past
MAX_JSON_DEPTH, NaN and Infinity, and numbers past a double (1e999 reads as infinity, and
int() of it raises OverflowError)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from rest_framework import parsers
from rest_framework.exceptions import ParseError

# Deep enough for any real metadata, shallow enough that nothing that walks a body
# recursively later (validation, the JSON column, rendering) can exhaust the stack.
MAX_JSON_DEPTH = 64


def client_json(text: str | bytes) -> Any:
    """A client's JSON document; ValueError (UnicodeDecodeError included) saying why not.
    The C decoder raises RecursionError on about a thousand levels; that, too, is the
    client's mistake."""
    try:
        data = json.loads(text, parse_float=_finite, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError(_too_deep()) from None
    if _depth_exceeds(data, MAX_JSON_DEPTH):
        raise ValueError(_too_deep())
    return data


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser reading through client_json: a body it refuses is a 400
    `malformed_request`."""

    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            return client_json(stream.read().decode(encoding))
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:20]} is past the largest number")
    return value


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def _too_deep() -> str:
    return f"nested deeper than {MAX_JSON_DEPTH} levels."


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
