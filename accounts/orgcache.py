"""Organization rows this process has read, and the epoch in Redis that says when to read them
again.

A request by an API key that needs its organization's row without a sandbox's (a create:
billing reads the plan and the cap, the create the limits and settings) read it from
PostgreSQL each time: a round trip after the key's own, a sixth of a create's time in the
server. A process now keeps the rows it read, as the driver returned them, and serves one
again only while the organizations' epoch is the one it read the row under; the epoch
rides in the round trip that authenticates the key and counts the rate limit
(accounts/authentication_reads.py).

Any change of an organization writes a new epoch: its save and delete (signals below,
connected by importing this module in AccountsConfig.ready) and a queryset update or delete
(accounts.signals.organizations_changed), at once and again when the transaction commits.
Organizations change seldom, so one epoch for all of them costs a read of each in each
process after a change, nothing more. An entry keeps the epoch read before its database
read; it is trusted at most MAX_AGE_S (an epoch that cannot be written makes this process
forget its entries; another may serve a row that old); without Redis nothing is cached.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from common import redis_scripts
from common.rows import RowLookup

from .models import Organization
from .signals import organizations_changed

if TYPE_CHECKING:
    from .principal import Principal

logger = logging.getLogger(__name__)

MAX_AGE_S = 60.0
MAX_ENTRIES = 10_000
"""Organization rows are small (a name of at most 100 characters): this bounds the memory."""

ORGANIZATION_BY_ID = RowLookup(Organization, "pk")
"""`Organization.objects.get(pk=...)`, written once (common/rows.py)."""


@dataclass(frozen=True)
class _Entry:
    row: tuple[Any, ...]
    epoch: Any
    loaded_at: float


_rows: dict[int, _Entry] = {}
_lock = threading.Lock()


def enabled() -> bool:
    return bool(settings.REDIS_URL)


def epoch_key() -> str:
    return f"{settings.CACHES['default'].get('KEY_PREFIX') or 'sandpit'}:organizations-epoch"


def keys_for(organization_id: int) -> list[str]:
    """Registered with accounts.authentication_reads (AccountsConfig.ready)."""
    return [epoch_key()] if enabled() else []


def _client() -> redis.Redis:
    return redis_scripts.shared_client(settings.REDIS_URL)


def organization_read(principal: Principal) -> Organization | None:
    """The principal's organization: this process's entry while the epoch read with the
    caller's authentication matches it, else the database's row (None: no such row)."""
    organization_id = principal.organization_id
    values = principal.take_values([epoch_key()]) if enabled() else None
    epoch = values[0] if values is not None else None
    if values is not None and epoch is None:  # Redis lost it, or never had one
        _write_epoch(only_if_missing=True)
    if epoch is not None:
        entry = _rows.get(organization_id)
        if (
            entry is not None
            and entry.epoch == epoch
            and time.monotonic() - entry.loaded_at <= MAX_AGE_S
        ):
            return ORGANIZATION_BY_ID.instance(entry.row)
    row = ORGANIZATION_BY_ID.row(organization_id)
    if row is None:
        return None
    if epoch is not None:
        with _lock:
            if len(_rows) >= MAX_ENTRIES:
                _rows.clear()
            _rows[organization_id] = _Entry(row, epoch, time.monotonic())
    return ORGANIZATION_BY_ID.instance(row)


def forget_all() -> None:
    with _lock:
        _rows.clear()


def held() -> int:
    """How many organizations' rows this process holds."""
    with _lock:
        return len(_rows)


def _write_epoch(*, only_if_missing: bool = False) -> None:
    try:
        condition = ("NX",) if only_if_missing else ()
        redis_scripts.command(_client(), "SET", epoch_key(), secrets.token_hex(8), *condition)
    except redis.RedisError:
        forget_all()
        logger.exception("organization rows: epoch not written; other processes see it late")


def organizations_written(using: str = DEFAULT_DB_ALIAS) -> None:
    """Make every process read every organization from the database again: now, and again
    when the transaction that changes them commits."""
    if not enabled():
        return
    _write_epoch()
    if connections[using].in_atomic_block:
        transaction.on_commit(_write_epoch, using=using)


@receiver(post_save, sender=Organization, dispatch_uid="accounts.orgcache.saved")
@receiver(post_delete, sender=Organization, dispatch_uid="accounts.orgcache.deleted")
@receiver(organizations_changed, dispatch_uid="accounts.orgcache.changed")
def _organization_changed(
    sender: Any, using: str = DEFAULT_DB_ALIAS, created: bool = False, **kwargs: Any
) -> None:
    if not created:  # a new organization's row is in no process yet
        organizations_written(using)
