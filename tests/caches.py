"""Set-up for tests of the per-process caches (accounts/keycache.py, accounts/orgcache.py,
sandboxes/row_cache.py): their Redis keys under a prefix of the test's own (Redis outlives
tests, and ids repeat across test databases), and nothing held from another test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

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
