"""Sandbox rows this process has read for a request naming a sandbox, and the generations in
Redis that say when to read them again.

Every request on a sandbox read its row from PostgreSQL (with its organization's, joined, for
an operation that bills): a pooled connection taken and given back, a round trip, and its two
system calls that each let go of the GIL. With ten clients reading at once that was a quarter
of a GET's CPU, and about an eighth of a command's. A process now keeps the rows it read (as
the driver returned them: nothing mutable), the plain and the joined one apart, and serves
one again only once Redis confirms that nothing changed it. The confirmation rides in the
round trip that authenticates the API key and counts the request for the rate limit
(accounts/authentication_reads.py): the request's own keys are the sandbox's generation and
an epoch.

Every write to a sandbox's row writes a new random generation for it (`rows_changed`): at
once, and again when its transaction commits when it runs inside one (a process that read
the row in between saw the old one). The model's save and delete, and the queryset updates
that name their rows (`SandboxQuerySet.update_row`), do it; any other queryset update or
delete (which cannot say which rows it changed) writes a new epoch, which makes every process
read every sandbox again. So does any change of an organization (its save or delete, and a
queryset update or delete, which send accounts.models.organizations_changed): the joined rows
hold its plan, cap and settings, and organizations change seldom. An entry is stored only
with the generation read *before* the database read it holds, so a change landing between the
two is never hidden.

Generations expire after GENERATION_TTL_S, far longer than an entry is trusted (MAX_AGE_S),
so an expired generation can never match an entry made before the change it recorded. If
writing a generation fails (Redis unreachable), this process forgets every entry; another
process may serve what it read before for at most MAX_AGE_S. Without Redis (the embedded
mode) nothing is cached.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from accounts.signals import organizations_changed
from common import redis_scripts
from common.rows import RowLookup

if TYPE_CHECKING:
    from accounts.principal import Principal

    from .models import Sandbox

logger = logging.getLogger(__name__)

MAX_AGE_S = 60.0
"""Longest an entry is trusted: bounds how late a change is seen whose generation could not
be written (Redis unreachable at that moment)."""
GENERATION_TTL_S = 3600
"""How long Redis keeps a sandbox's generation (a key per sandbox changed in that time)."""
MAX_ENTRIES = 10_000
MAX_TEXT_CHARS = 4_000_000
"""Bound on the text the entries hold together (a sandbox's metadata alone may be 16 KB):
with MAX_ENTRIES, what keeps a process's memory bounded whatever its clients store."""

NEVER_KEPT_STATE = "creating"
"""SandboxState.CREATING (sandboxes.models imports this module): a row in that state is read
from the database every time, so that a create's move out of it, the one write on the path of
every create, need not write a generation (provider_access.sandbox_transition's
`from_state`): no process can hold the row it changes."""

Generation = tuple[Any, Any]
"""(the sandbox's generation, the epoch) as Redis returned them; the first None while the
sandbox has not changed within GENERATION_TTL_S."""


@dataclass(frozen=True)
class _Entry:
    row: tuple[Any, ...]
    organization_id: int
    generation: Generation
    loaded_at: float


_rows: dict[tuple[str, str], _Entry] = {}
"""By (the lookup's join, "" for none; the sandbox's id)."""
_text_chars = 0
_lock = threading.Lock()


def enabled() -> bool:
    return bool(settings.REDIS_URL)


def _prefix() -> str:
    return settings.CACHES["default"].get("KEY_PREFIX") or "sandpit"


def generation_keys(sandbox_id: str) -> list[str]:
    """The Redis keys whose values make up a sandbox's generation: its own, then the epoch."""
    return [f"{_prefix()}:sandbox-gen:{sandbox_id}", f"{_prefix()}:sandbox-gen-epoch"]


def keys_for_request(method: str, url_kwargs: Mapping[str, Any]) -> list[str]:
    """Registered with accounts.authentication_reads (SandboxesConfig.ready): a request that
    names a sandbox reads its generation in the authentication's round trip (whatever its
    method: a GET reads the row, an operation the row with its organization's). A POST that
    names none may create one, and reads the epoch, under which its create keeps the row it
    wrote (`keep_created`)."""
    if not enabled():
        return []
    sandbox_id = url_kwargs.get("sandbox_id")
    if sandbox_id is None and method == "POST":
        return generation_keys("")[1:]
    if not isinstance(sandbox_id, str):
        return []
    return generation_keys(sandbox_id)


def epoch_read_with(principal: Principal | None) -> Any:
    """The epoch read in the round trip that authenticated this request (keys_for_request),
    taken once; None when it was not read there (another kind of caller, no Redis) or
    Redis holds none."""
    if principal is None or not enabled():
        return None
    values = principal.take_values(generation_keys("")[1:])
    return None if values is None else values[0]


def keep_created(
    lookup: RowLookup[Sandbox],
    row: tuple[Any, ...],
    *,
    sandbox_id: str,
    organization_id: int,
    epoch: Any,
) -> None:
    """Keep `row`, as `lookup` reads it, which a create's write wrote and returned (its move
    out of NEVER_KEPT_STATE, RowLookup.update_sql, or its insert already running, on a warm
    sandbox set aside for it, RowLookup.insert_sql), so that the sandbox's next request
    (nearly always its first command) reads no row.

    Kept under the generation that request will read while nothing changes the row: none of
    the sandbox's own (neither an insert nor that move writes one) and `epoch`, read before
    the write. Every later write to the row writes a generation, and every change of the
    epoch a new one, so the entry then matches nothing; nor does it if the epoch changed
    before the write, or a generation was written for the sandbox before it."""
    _store(
        (lookup.join or "", sandbox_id),
        _Entry(row, organization_id, (None, epoch), time.monotonic()),
    )


def _client() -> redis.Redis:
    return redis_scripts.shared_client(settings.REDIS_URL)


def sandbox_read(
    lookup: RowLookup[Sandbox], *, principal: Principal, sandbox_id: str
) -> Sandbox | None:
    """`lookup.get(sandbox_id, principal.organization_id)`, answered from this process's
    entry when the generation read with the caller's authentication matches it."""
    values = principal.take_values(generation_keys(sandbox_id)) if enabled() else None
    generation = _generation_of(values) if values is not None else None
    organization_id = principal.organization_id
    key = (lookup.join or "", sandbox_id)
    if generation is not None:
        entry = _rows.get(key)
        if (
            entry is not None
            and entry.generation == generation
            and entry.organization_id == organization_id
            and time.monotonic() - entry.loaded_at <= MAX_AGE_S
        ):
            return lookup.instance(entry.row)
    row = lookup.row(sandbox_id, organization_id)
    if row is None:
        return None
    sandbox = lookup.instance(row)
    if generation is not None and sandbox.state != NEVER_KEPT_STATE:
        _store(key, _Entry(row, organization_id, generation, time.monotonic()))
    return sandbox


def _generation_of(values: Sequence[Any]) -> Generation | None:
    """None while Redis has no epoch (nothing read under it may be trusted: the epoch is what
    makes a Redis that lost its data visible); one is written for the next request."""
    if values[1] is None:
        try:
            _client().set(generation_keys("")[1], secrets.token_hex(8), nx=True)
        except redis.RedisError:
            logger.warning("sandbox rows: no epoch written; rows are read from the database")
        return None
    return values[0], values[1]


def _text_of(row: tuple[Any, ...]) -> int:
    return sum(len(value) for value in row if isinstance(value, str | bytes))


def _store(key: tuple[str, str], entry: _Entry) -> None:
    global _text_chars
    size = _text_of(entry.row)
    with _lock:
        replaced = _rows.get(key)
        if replaced is not None:
            _text_chars -= _text_of(replaced.row)
        if len(_rows) >= MAX_ENTRIES or _text_chars + size > MAX_TEXT_CHARS:
            _rows.clear()  # bound the memory: forget everything, re-read
            _text_chars = 0
        _rows[key] = entry
        _text_chars += size


def forget_all() -> None:
    """Forget every entry of this process (tests; a generation that could not be written)."""
    global _text_chars
    with _lock:
        _rows.clear()
        _text_chars = 0


def held() -> tuple[int, int]:
    """(entries, characters of text) this process holds."""
    with _lock:
        return len(_rows), _text_chars


def rows_changed(sandbox_ids: Iterable[str] | None, using: str = DEFAULT_DB_ALIAS) -> None:
    """Make every process read these sandboxes' rows from the database again (None: every
    sandbox's): now, and again when the transaction that changes them commits."""
    if not enabled():
        return
    expiry: tuple[str | int, ...]
    if sandbox_ids is None:  # the epoch, kept until Redis loses it
        keys, expiry = [generation_keys("")[1]], ()
    else:
        keys = [generation_keys(sandbox_id)[0] for sandbox_id in sandbox_ids]
        expiry = ("EX", GENERATION_TTL_S)
        if not keys:
            return

    def write() -> None:
        token = secrets.token_hex(8)
        try:
            for key in keys:
                redis_scripts.command(_client(), "SET", key, token, *expiry)
        except redis.RedisError:
            forget_all()
            logger.exception("sandbox rows: generation not written; other processes see it late")

    write()
    if connections[using].in_atomic_block:
        transaction.on_commit(write, using=using)


# The model by name: this module is imported before the app registry is ready.
@receiver(post_save, sender="accounts.Organization", dispatch_uid="sandboxes.row_cache.org_saved")
@receiver(post_delete, sender="accounts.Organization", dispatch_uid="sandboxes.row_cache.org_gone")
@receiver(organizations_changed, dispatch_uid="sandboxes.row_cache.organizations_changed")
def _organization_changed(
    sender: Any, using: str = DEFAULT_DB_ALIAS, created: bool = False, **kwargs: Any
) -> None:
    """An organization's row rides in the entries of operations (joined): read them all
    again (not for a new organization, which has no sandboxes yet)."""
    if not created:
        rows_changed(None, using=using)
