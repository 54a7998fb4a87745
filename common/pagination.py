from __future__ import annotations

from typing import Any

from rest_framework.pagination import LimitOffsetPagination

from common.errors import ApplicationError

# Past this, a count of rows is no count (and int() of a longer digit string is slow).
_MAX_DIGITS = 18
MAX_OFFSET = 10**_MAX_DIGITS - 1


class CursorlessPagination(LimitOffsetPagination):
    """?limit=&offset= with {"count", "next", "previous", "results"}.

    Strict where DRF is lenient: DRF answers the default page for `?limit=abc`, `?limit=0` or
    `?offset=-5`, so a client's mistake reads as data. Here a value that is not a whole number
    (limit at least 1, offset at least 0), or one given twice, is a 400; a limit above
    `max_limit` still reads as `max_limit`, as documented."""

    default_limit = 50
    max_limit = 500

    def get_limit(self, request: Any) -> int:
        given = _whole_number(request, self.limit_query_param, least=1, above=self.max_limit)
        return self.default_limit if given is None else min(given, self.max_limit)

    def get_offset(self, request: Any) -> int:
        given = _whole_number(request, self.offset_query_param, least=0)
        return 0 if given is None else given


def _whole_number(request: Any, name: str, *, least: int, above: int | None = None) -> int | None:
    """The parameter's one value, a whole number of at least `least`; None when absent.
    Longer than _MAX_DIGITS: `above`, where given (any larger reads the same), else a 400
    (an offset past a bigint would fail in the database)."""
    values = request.query_params.getlist(name)
    if not values:
        return None
    if len(values) > 1:
        raise ApplicationError(f"{name} is given more than once.", code="validation_error")
    text = values[0]
    if above is not None and text.isascii() and text.isdigit() and len(text) > _MAX_DIGITS:
        return above
    if not (text.isascii() and text.isdigit()) or len(text) > _MAX_DIGITS or int(text) < least:
        raise ApplicationError(
            f"{name} must be a whole number, at least {least}; got {text[:40]!r}.",
            code="validation_error",
        )
    return int(text)
