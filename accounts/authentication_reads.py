"""Redis keys other apps read in the round trip that authenticates an API key.

Authenticating an API key this process knows already makes one Redis round trip: it
confirms the key and counts the request for the rate limit (accounts.authentication). A
metered request then read its organization's billing period in a round trip of its own. An
app registers here what it will read for an organization (billing: the period's counters);
those keys ride in the authentication's round trip, and their values wait on the principal
for one use (Principal.take_values). A reader that finds them missing (another kind of
caller, another period) reads Redis itself, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

KeysFor = Callable[[int], Sequence[str]]
"""An organization's id -> the Redis keys to read for it (full names, on REDIS_URL)."""

_readers: list[KeysFor] = []


def read_at_authentication(keys_for: KeysFor) -> KeysFor:
    """Register `keys_for` (once; an app's ready() calls this)."""
    if keys_for not in _readers:
        _readers.append(keys_for)
    return keys_for


def keys_for(organization_id: int) -> list[str]:
    """Every registered reader's keys for `organization_id`."""
    return [key for reader in _readers for key in reader(organization_id)]
