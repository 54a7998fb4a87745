"""Redis keys other apps read in the round trip that authenticates an API key.

Authenticating an API key this process knows already makes one Redis round trip: it
confirms the key and counts the request for the rate limit (accounts.authentication). A
metered request then read its organization's billing period in a round trip of its own. An
app registers here what it will read for an organization (billing: the period's counters);
those keys ride in the authentication's round trip, and their values wait on the principal
for one use (Principal.take_values). A reader that finds them missing (another kind of
caller, another period) reads Redis itself, as before.

An app may also register keys that depend on the request (its method and its URL's keyword
arguments): sandboxes reads the generation of the sandbox a GET names, so that a row it read
before can be confirmed unchanged without asking the database (sandboxes/row_cache.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

KeysFor = Callable[[int], Sequence[str]]
"""An organization's id -> the Redis keys to read for it (full names, on REDIS_URL)."""

RequestKeysFor = Callable[[str, Mapping[str, Any]], Sequence[str]]
"""(a request's method, its URL's keyword arguments) -> the Redis keys to read for it."""

_readers: list[KeysFor] = []
_request_readers: list[RequestKeysFor] = []


def read_at_authentication(keys_for: KeysFor) -> KeysFor:
    """Register `keys_for` (once; an app's ready() calls this)."""
    if keys_for not in _readers:
        _readers.append(keys_for)
    return keys_for


def keys_for(organization_id: int) -> list[str]:
    """Every registered reader's keys for `organization_id`."""
    return [key for reader in _readers for key in reader(organization_id)]


def read_for_requests(keys_for_request: RequestKeysFor) -> RequestKeysFor:
    """Register `keys_for_request` (once; an app's ready() calls this)."""
    if keys_for_request not in _request_readers:
        _request_readers.append(keys_for_request)
    return keys_for_request


def request_keys_for(method: str, url_kwargs: Mapping[str, Any]) -> list[str]:
    """Every registered request reader's keys for this request."""
    return [key for reader in _request_readers for key in reader(method, url_kwargs)]
