"""Set-up and probes for tests of the per-process caches (accounts/keycache.py, accounts/orgcache.py,
sandboxes/row_cache.py): their Redis keys under a prefix of the test's own (Redis outlives
tests, and ids repeat across test databases), and nothing held from another test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connections
from django.test.utils import CaptureQueriesContext

from accounts import keycache, orgcache
from sandboxes import row_cache
from tests.requirements import missing_part

FORGET = (keycache.known_clear, orgcache.forget_all, row_cache.forget_all)


@contextmanager
def own_cache_prefix(settings: Any, label: str) -> Iterator[None]:
    """For the `with` block: the caches' keys under `test-<label>-<random>`, every cache
    empty at its start and its end. Skips (or fails, where Redis is required) without
    REDIS_URL."""
    if not settings.REDIS_URL:
        missing_part("REDIS_URL is not set")
    cache = {**settings.CACHES["default"], "KEY_PREFIX": f"test-{label}-{uuid.uuid4().hex}"}
    settings.CACHES = {**settings.CACHES, "default": cache}
    for forget in FORGET:
        forget()
    try:
        yield
    finally:
        for forget in FORGET:
            forget()


def row_reads(call: Any, tables: tuple[str, ...]) -> tuple[Any, int]:
    """(what `call()` answered, how many statements read a row of `tables`, e.g.
    '"sandboxes_sandbox"'). A row lock (FOR UPDATE: a create's limit) is not a read."""
    with CaptureQueriesContext(connections["default"]) as queries:
        response = call()
    return response, sum(
        q["sql"].startswith("SELECT")
        and any(table in q["sql"] for table in tables)
        and "FOR UPDATE" not in q["sql"]
        for q in queries.captured_queries
    )


def until_no_row_is_read(
    call: Any, tables: tuple[str, ...], *, status: int = 200, attempts: int = 6
) -> Any:
    """Call until a call reads no row of `tables` (the caches warm within a few requests:
    the first writes the epochs, the next stores the rows); its answer, which must have
    `status` every time."""
    reads = -1
    for _ in range(attempts):
        response, reads = row_reads(call, tables)
        assert response.status_code == status, response.content
        if reads == 0:
            return response
    raise AssertionError(f"still {reads} row reads after {attempts} calls")
