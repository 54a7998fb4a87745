"""API keys this process has seen, and the generations in Redis that say when to forget them.

Authenticating an API key from the database costs a query (the key and its organization) on
every request. A process keeps the keys it has verified (id, organization id, expiry, never
the secret: entries are found by a digest of it) and trusts one again only once Redis
confirms that nothing changed the key since it was read. Every change that can end a key
(revocation, any save, deletion, also by cascade from its organization) writes a new
random value under the key's generation (signal receivers below, connected by
AccountsConfig.ready), at once and again when its transaction commits, so the next request
in any process sees the difference and reads the key from the database again. Revocation
stays as immediate across processes as with a query per request; the confirmation rides in
the Redis round trip that counts the request for the rate limit (accounts.throttling).

Entries are written only with the generation read *before* the database read they hold
(a first sighting is stored as unconfirmed), so a change that lands between the two is
never hidden. An epoch value catches a Redis that lost its data. A change written behind
the model's back (a queryset update) is seen within MAX_AGE_S.
Without Redis (the embedded mode) nothing is cached: every request queries.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import redis
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, transaction
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from common import redis_scripts

from .models import ApiKey

logger = logging.getLogger(__name__)

MAX_AGE_S = 300.0
"""Longest an entry is trusted without a database read: bounds how late a change made
without a model save or delete (a queryset update) is seen."""
MAX_ENTRIES = 10_000

Generation = tuple[Any, Any]
"""(the key's generation, the epoch) as Redis returned them; None where absent."""

_FIELDS = tuple(field.attname for field in ApiKey._meta.concrete_fields)


@dataclass(frozen=True)
class KnownKey:
    """A verified key as the database held it, and the generation read before that read
    (None: not confirmed yet, the next request reads the database again)."""

    values: tuple[object, ...]
    generation: Generation | None
    loaded_at: float

    def api_key(self) -> ApiKey:
        """A fresh model instance per request (callers may change theirs)."""
        return ApiKey.from_db(DEFAULT_DB_ALIAS, list(_FIELDS), list(self.values))

    @property
    def id(self) -> int:
        return self.values[_FIELDS.index("id")]  # type: ignore[return-value]

    @property
    def organization_id(self) -> int:
        return self.values[_FIELDS.index("organization_id")]  # type: ignore[return-value]

    @property
    def prefix(self) -> str:
        return self.values[_FIELDS.index("prefix")]  # type: ignore[return-value]

    @property
    def expires_at(self) -> datetime | None:
        return self.values[_FIELDS.index("expires_at")]  # type: ignore[return-value]

    @property
    def last_used_at(self) -> datetime | None:
        return self.values[_FIELDS.index("last_used_at")]  # type: ignore[return-value]

    def with_field(self, name: str, value: object) -> KnownKey:
        values = list(self.values)
        values[_FIELDS.index(name)] = value
        return replace(self, values=tuple(values))


_known: dict[str, KnownKey] = {}
_lock = threading.Lock()


def enabled() -> bool:
    return bool(settings.REDIS_URL)


def digest(secret: str) -> str:
    """What entries are found by (the secret itself is never kept)."""
    return hashlib.sha256(secret.encode()).hexdigest()


def known_get(found_by: str) -> KnownKey | None:
    """The entry for a secret's digest, if one is young enough to be confirmed."""
    entry = _known.get(found_by)
    if entry is None or time.monotonic() - entry.loaded_at > MAX_AGE_S:
        return None
    return entry


def known_put(found_by: str, api_key: ApiKey, generation: Generation | None) -> None:
    """Remember a key just read from the database (active, its secret verified), with the
    generation read before that read."""
    entry = KnownKey(
        tuple(getattr(api_key, name) for name in _FIELDS), generation, time.monotonic()
    )
    with _lock:
        if len(_known) >= MAX_ENTRIES:  # bound the memory: forget everything, re-read
            _known.clear()
        _known[found_by] = entry


def known_replace(found_by: str, entry: KnownKey) -> None:
    with _lock:
        _known[found_by] = entry


def known_clear() -> None:
    """Forget every entry (tests)."""
    with _lock:
        _known.clear()


def _prefix() -> str:
    return settings.CACHES["default"].get("KEY_PREFIX") or "sandpit"


def generation_keys(api_key_prefix: str) -> list[str]:
    """The Redis keys whose values make up a key's generation: its own, then the epoch."""
    return [f"{_prefix()}:apikey-gen:{api_key_prefix}", f"{_prefix()}:apikey-gen-epoch"]


def generation_of(values: Sequence[Any]) -> Generation | None:
    """A generation read from Redis; None while there is no epoch yet (nothing read under
    it may be trusted: the epoch is what makes a Redis that lost its data visible)."""
    if values[1] is None:
        _epoch_start()
        return None
    return values[0], values[1]


def _client() -> redis.Redis:
    return redis_scripts.shared_client(settings.REDIS_URL)


def generation_values(keys: Sequence[str]) -> list[Any]:
    """The values of generation_keys() read on their own (when no rate limit is counted
    in the same round trip)."""
    return list(redis_scripts.command(_client(), "MGET", *keys))


def _epoch_start() -> None:
    _client().set(generation_keys("")[1], secrets.token_hex(8), nx=True)


def api_key_changed(api_key_prefix: str) -> None:
    """Make every process read this key from the database again: now, and again when the
    transaction that changes it commits (a process that re-read it in between saw the old
    row)."""
    if not enabled():
        return

    def bump() -> None:
        try:
            _client().set(generation_keys(api_key_prefix)[0], secrets.token_hex(8))
        except redis.RedisError:
            logger.exception(
                "api key %s: generation not written; caches see it late", api_key_prefix
            )

    bump()
    transaction.on_commit(bump)


@receiver(post_save, sender=ApiKey, dispatch_uid="accounts.keycache.saved")
def _saved(sender: type[ApiKey], instance: ApiKey, **kwargs: object) -> None:
    api_key_changed(instance.prefix)


@receiver(post_delete, sender=ApiKey, dispatch_uid="accounts.keycache.deleted")
def _deleted(sender: type[ApiKey], instance: ApiKey, **kwargs: object) -> None:
    api_key_changed(instance.prefix)
