"""Metering: may this organization run a metered operation now, and count one that ran.

The sandbox API and the WebSocket consumers call `metering_authorize` before a metered
operation and `metering_record` after it succeeded. Both sit on the hot path, so neither
takes a database row lock nor scans a table:

* With REDIS_URL: `metering_record` is one Lua call (one round trip) that dedupes the
  event id (SET NX with a TTL), appends the event to a per-installation Redis stream and
  increments the organization's counter for the period. `metering_authorize` reads that
  counter (one MGET). `flush_usage` (Celery, every 10 s) moves the stream into PostgreSQL:
  ledger rows with a UNIQUE event_id and the daily rollup in one transaction, then XDEL of
  exactly the entries it wrote. A flush killed at any point is simply run again: entries
  not yet deleted are re-read, the ledger skips the ones already stored, and the rollup
  only grows by the rows actually added. Nothing is lost or counted twice.
* Without REDIS_URL (embedded SQLite): `metering_record` inserts the ledger row directly;
  the flush later folds unaggregated rows into the daily rollup. The counter for
  `metering_authorize` lives in the local cache and is re-read from the database every
  minute. A record the database cannot take (SQLite's write lock held past its busy
  timeout) is kept on disk instead and moved into the ledger by the next flush
  (billing/usage_spool.py).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any, Protocol

import redis
from django.conf import settings
from django.core.cache import cache
from django.db import DatabaseError, connection, transaction
from django.utils import timezone
from redis.exceptions import LockError

from accounts.models import Organization
from common.database_errors import StorageFull, database_unavailable
from common.errors import PaymentRequired
from common.redis_scripts import LuaScript
from common.redis_scripts import command as redis_command

from . import pricing, usage_spool
from .ledger import (
    MeteredEvent,
    daily_add,
    daily_counts,
    ledger_insert,
    plan_change_due,
    usage_count_between,
    usage_count_in_ledger,
)
from .models import PlanChange, UsageEvent

logger = logging.getLogger(__name__)

FREE_FEATURES = set(pricing.FREE_FEATURES)
PREMIUM_FEATURES = set(pricing.PREMIUM_FEATURES)

DEDUPE_TTL_S = 7 * 24 * 3600
"""How long Redis remembers an event id. Far longer than the flush interval (10 s); after
it, the ledger's unique constraint still keeps a late duplicate out of the database."""
COUNTER_TTL_S = 40 * 24 * 3600
"""Period counters outlive their month, then expire by themselves."""
LOCAL_COUNTER_TTL_S = 60
"""Embedded mode: the cached period count is re-read from the database this often."""
MAX_EVENT_ID_CHARS = 100


class PremiumRequired(PaymentRequired):
    code = "premium_required"


class FreeAllowanceExhausted(PaymentRequired):
    code = "free_allowance_exhausted"


class SpendingCapReached(PaymentRequired):
    code = "spending_cap_reached"


ReadValues = Callable[[Sequence[str]], list[Any] | None]
"""Redis keys -> their values when they were read already (Principal.take_values), else None."""


@dataclass(frozen=True)
class PeriodState:
    """What authorize needs to know about an organization's current period."""

    executions: int
    """Executions recorded so far this period (flushed or not)."""
    plan_change_due: bool
    """A scheduled plan change has reached its effective time and is not applied yet."""


class Meter(Protocol):
    """A metering backend: where the hot-path counter and the unflushed events live."""

    def record(self, event: MeteredEvent) -> bool:
        """Count `event` once; False if its event id was already counted."""
        ...

    def period_state(
        self, organization_id: int, start: date, now: datetime, read: ReadValues | None = None
    ) -> PeriodState: ...

    def pending(self, organization_id: int, start: date) -> list[MeteredEvent]:
        """Events recorded in the period that may not be in the ledger yet."""
        ...

    def flag_plan_change(self, organization_id: int, effective_at: datetime | None) -> None:
        """Remember (or forget, with None) that a plan change takes effect at `effective_at`."""
        ...

    def can_record(self) -> bool:
        """Whether a record made now has somewhere to go (checked before the operation)."""
        ...


# --- Redis backend ---------------------------------------------------------------------

# KEYS: dedupe key, stream, period counter, epoch.  ARGV: dedupe TTL, event id, org id,
# api key id, operation, occurred_at (µs since 1970), counter TTL.  The epoch is kept at the
# earliest occurred_at this Redis dataset has counted, so no event in a counter is older
# than it (threads racing on the first event may reach Redis out of timestamp order).
_RECORD_LUA = """
if redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) == false then return 0 end
local epoch = redis.call('GET', KEYS[4])
if (not epoch) or tonumber(ARGV[6]) < tonumber(epoch) then redis.call('SET', KEYS[4], ARGV[6]) end
redis.call('XADD', KEYS[2], '*', 'e', ARGV[2], 'o', ARGV[3], 'k', ARGV[4], 'op', ARGV[5], 't', ARGV[6])
redis.call('INCR', KEYS[3])
redis.call('EXPIRE', KEYS[3], ARGV[7])
return 1
"""
# KEYS: epoch.  ARGV: now (µs).  Returns the epoch, creating it if Redis has none.
_EPOCH_LUA = """
redis.call('SET', KEYS[1], ARGV[1], 'NX')
return redis.call('GET', KEYS[1])
"""
# KEYS: seeded flag, period counter.  ARGV: executions to add, TTL.  Adds them once; INCRBY
# (not SET) keeps the executions recorded while the database was being read.
_SEED_LUA = """
if redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[2]) == false then
  return tonumber(redis.call('GET', KEYS[2]) or '0')
end
local value = redis.call('INCRBY', KEYS[2], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return value
"""


class RedisMeter:
    """Counters, dedupe keys and the event stream in Redis; see the module docstring."""

    def __init__(self, url: str, prefix: str) -> None:
        self.client: Any = redis.Redis.from_url(url)
        self.prefix = prefix
        self.stream = f"{prefix}:events"
        self.flush_lock = f"{prefix}:flush-lock"
        self.epoch = f"{prefix}:epoch"
        self._record = LuaScript(self.client, _RECORD_LUA)
        self._record_pipelined = self.client.register_script(_RECORD_LUA)
        self._epoch = LuaScript(self.client, _EPOCH_LUA)
        self._seed = LuaScript(self.client, _SEED_LUA)

    def _counter(self, organization_id: int, start: date) -> str:
        return f"{self.prefix}:count:{organization_id}:{pricing.period_key(start)}"

    def _seeded(self, organization_id: int, start: date) -> str:
        return f"{self.prefix}:seeded:{organization_id}:{pricing.period_key(start)}"

    def _plan_change(self, organization_id: int) -> str:
        return f"{self.prefix}:plan-change:{organization_id}"

    def _record_call(self, event: MeteredEvent) -> tuple[list[str], list[int | str]]:
        start = pricing.period_start(event.occurred_at)
        keys = [
            f"{self.prefix}:event:{event.event_id}",
            self.stream,
            self._counter(event.organization_id, start),
            self.epoch,
        ]
        args: list[int | str] = [
            DEDUPE_TTL_S,
            event.event_id,
            event.organization_id,
            "" if event.api_key_id is None else event.api_key_id,
            event.operation,
            _to_micros(event.occurred_at),
            COUNTER_TTL_S,
        ]
        return keys, args

    def record(self, event: MeteredEvent) -> bool:
        keys, args = self._record_call(event)
        return bool(self._record(keys=keys, args=args))

    def record_many(self, events: list[MeteredEvent]) -> None:
        """Record many events in one pipeline (backfills, benchmarks and tests)."""
        pipe = self.client.pipeline(transaction=False)
        for event in events:
            keys, args = self._record_call(event)
            self._record_pipelined(keys=keys, args=args, client=pipe)
        pipe.execute()

    def period_keys(self, organization_id: int, start: date) -> list[str]:
        """What period_state reads: the counter, its seeded flag, the plan change, the epoch."""
        return [
            self._counter(organization_id, start),
            self._seeded(organization_id, start),
            self._plan_change(organization_id),
            self.epoch,
        ]

    def period_state(
        self, organization_id: int, start: date, now: datetime, read: ReadValues | None = None
    ) -> PeriodState:
        """The period counter is exact when this Redis dataset began (its epoch: the earliest
        execution it counted, or the first authorize) before the period did. Otherwise (Redis was emptied, or
        metering began, mid-period) it is seeded once with the ledger's executions of the
        period from before the epoch; later ones are in the counter already.

        `read` may hold the keys' values already (read with the request's authentication);
        when it gives None they are read here."""
        keys = self.period_keys(organization_id, start)
        values = read(keys) if read is not None else None
        if values is None:
            values = redis_command(self.client, "MGET", *keys)
        count, seeded_flag, change_at, epoch = values
        counter, seeded = keys[0], keys[1]
        if epoch is None:
            epoch = self._epoch(keys=[self.epoch], args=[_to_micros(now)])
        begin, _ = pricing.period_bounds(start)
        epoch_at = _from_micros(int(epoch))
        if epoch_at > begin and seeded_flag is None:
            base = usage_count_between(organization_id=organization_id, begin=begin, end=epoch_at)
            count = self._seed(keys=[seeded, counter], args=[base, COUNTER_TTL_S])
        due = change_at is not None and float(change_at) <= now.timestamp()
        return PeriodState(int(count or 0), due)

    def pending(self, organization_id: int, start: date) -> list[MeteredEvent]:
        begin, end = pricing.period_bounds(start)
        wanted = str(organization_id).encode()
        events = []
        for _, fields in self.client.xrange(self.stream, "-", "+"):
            if fields.get(b"o") != wanted:
                continue
            event = _event_from_fields(fields)
            if event is not None and begin <= event.occurred_at < end:
                events.append(event)
        return events

    def flag_plan_change(self, organization_id: int, effective_at: datetime | None) -> None:
        if effective_at is None:
            self.client.delete(self._plan_change(organization_id))
        else:
            self.client.set(
                self._plan_change(organization_id), effective_at.timestamp(), ex=COUNTER_TTL_S
            )

    def can_record(self) -> bool:
        return True  # Redis holds the record; its unavailability is an error of its own

    # Flush helpers (used by services.usage_flush) --------------------------------------

    def read_batch(self, count: int) -> list[tuple[bytes, MeteredEvent | None]]:
        """The oldest `count` stream entries as (entry id, event or None if malformed)."""
        return [
            (entry_id, _event_from_fields(f))
            for entry_id, f in self.client.xrange(self.stream, "-", "+", count=count)
        ]

    def ack(self, entry_ids: list[bytes]) -> None:
        """Delete flushed entries by id (idempotent; never touches entries not named)."""
        if entry_ids:
            self.client.xdel(self.stream, *entry_ids)

    def backlog(self) -> int:
        return int(self.client.xlen(self.stream))


def _to_micros(moment: datetime) -> int:
    delta = moment.astimezone(UTC) - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _from_micros(micros: int) -> datetime:
    seconds, rest = divmod(micros, 1_000_000)
    return datetime.fromtimestamp(seconds, tz=UTC).replace(microsecond=rest)


def _event_from_fields(fields: dict[bytes, bytes]) -> MeteredEvent | None:
    try:
        key = fields.get(b"k", b"")
        return MeteredEvent(
            event_id=fields[b"e"].decode(),
            organization_id=int(fields[b"o"]),
            api_key_id=int(key) if key else None,
            operation=fields.get(b"op", b"").decode(),
            occurred_at=_from_micros(int(fields[b"t"])),
        )
    except (KeyError, ValueError, UnicodeDecodeError):
        return None


# --- Database backend (embedded mode) --------------------------------------------------------


class DatabaseMeter:
    """No Redis: the ledger row is written at once; the period count is cached locally."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def _counter(self, organization_id: int, start: date) -> str:
        return f"{self.prefix}:count:{organization_id}:{pricing.period_key(start)}"

    def _plan_change(self, organization_id: int) -> str:
        return f"{self.prefix}:plan-change:{organization_id}"

    def record(self, event: MeteredEvent) -> bool:
        key = self._counter(event.organization_id, pricing.period_start(event.occurred_at))
        try:
            with transaction.atomic():
                added = ledger_insert([event], aggregated_at=None)
        except DatabaseError as exc:
            # The operation ran: keep its record rather than lose it (inside a caller's
            # transaction the failure is that transaction's to handle).
            if connection.in_atomic_block or not database_unavailable(exc):
                raise
            if usage_spool.keep(event):
                logger.warning("usage record kept on disk, the database could not take it: %s", exc)
            _cache_incr(key)
            return True
        if usage_spool.held_count():
            usage_spool.write_held()  # the disk takes writes again
        if added:
            transaction.on_commit(lambda: _cache_incr(key))
        return bool(added)

    def period_state(
        self, organization_id: int, start: date, now: datetime, read: ReadValues | None = None
    ) -> PeriodState:
        """`read` is ignored: nothing here is in Redis."""
        counter = self._counter(organization_id, start)
        values = cache.get_many([counter, self._plan_change(organization_id)])
        count = values.get(counter)
        if count is None:
            count = usage_count_in_ledger(organization_id=organization_id, start=start) + len(
                self.pending(organization_id, start)
            )
            cache.set(counter, count, LOCAL_COUNTER_TTL_S)
            if plan_change_due(organization_id=organization_id, now=now):
                return PeriodState(count, True)
        change_at = values.get(self._plan_change(organization_id))
        return PeriodState(int(count), change_at is not None and change_at <= now.timestamp())

    def pending(self, organization_id: int, start: date) -> list[MeteredEvent]:
        """Records kept on disk (the ledger is otherwise written synchronously and its
        unaggregated rows are read from it)."""
        begin, end = pricing.period_bounds(start)
        return [
            event
            for event in usage_spool.spooled_for(organization_id)
            if begin <= event.occurred_at < end
        ]

    def flag_plan_change(self, organization_id: int, effective_at: datetime | None) -> None:
        if effective_at is None:
            cache.delete(self._plan_change(organization_id))
        else:
            cache.set(self._plan_change(organization_id), effective_at.timestamp(), COUNTER_TTL_S)

    def can_record(self) -> bool:
        """The ledger and the spool share the var directory's disk: with too little room
        left on it, neither could keep the record of an operation allowed now."""
        return usage_spool.has_headroom()


def _cache_incr(key: str) -> None:
    try:
        cache.incr(key)
    except ValueError:
        pass  # not cached: the next authorize reads the database


# --- Backend selection ------------------------------------------------------------------------

_meters: dict[tuple[str, str], Meter] = {}
_meters_lock = threading.Lock()


def key_prefix() -> str:
    """Redis/cache key prefix: per installation, so two installations can share a Redis."""
    base = settings.CACHES["default"].get("KEY_PREFIX") or "sandpit"
    return f"{base}:billing:{settings.SANDPIT_INSTALLATION}"


def get_meter() -> Meter:
    """The metering backend for the current settings (Redis when REDIS_URL is set)."""
    url = settings.REDIS_URL
    prefix = key_prefix()
    meter = _meters.get((url, prefix))
    if meter is None:
        with _meters_lock:
            meter = _meters.get((url, prefix))
            if meter is None:
                meter = RedisMeter(url, prefix) if url else DatabaseMeter(prefix)
                _meters[(url, prefix)] = meter
    return meter


def period_keys_for(organization_id: int) -> list[str]:
    """The Redis keys metering_authorize reads for `organization_id` now (none without Redis):
    registered to be read in the round trip that authenticates an API key
    (accounts/authentication_reads.py, BillingConfig.ready)."""
    meter = get_meter()
    if not isinstance(meter, RedisMeter):
        return []
    return meter.period_keys(organization_id, pricing.period_start(timezone.now()))


# --- The contract ---------------------------------------------------------------------------------


def metering_authorize(
    *,
    organization: Organization,
    feature: str,
    now: datetime | None = None,
    read: ReadValues | None = None,
) -> None:
    """Allow a metered operation of `feature` for `organization` now, or raise PaymentRequired.

    Raises PremiumRequired ('premium_required') for a premium feature on the free plan,
    FreeAllowanceExhausted ('free_allowance_exhausted') once the free plan's monthly
    allowance is used, SpendingCapReached ('spending_cap_reached') when one more execution
    would take the period's total over the organization's spending cap. StorageFull (a 503
    at the doors) when the meter could not keep the record: its disk is nearly full.
    ValueError for an unknown feature (a programming error). One cache round trip, none when `read` gives the
    period's keys (read with the request's authentication, period_keys_for); the database
    is read only on the first call of a period and when a scheduled plan change falls due.

    Checked before the operation runs, so N requests racing at the boundary may all pass:
    the allowance or cap can be exceeded by at most the number of requests in flight.
    """
    premium_feature = feature in PREMIUM_FEATURES
    if not premium_feature and feature not in FREE_FEATURES:
        raise ValueError(f"unknown metered feature {feature!r}")
    now = now or timezone.now()
    start = pricing.period_start(now)
    meter = get_meter()
    if not meter.can_record():
        raise StorageFull("no room left to record usage")
    state = meter.period_state(organization.pk, start, now, read)
    if state.plan_change_due:
        plan_changes_apply_due(organization=organization, now=now)
    allowance = settings.SANDPIT_FREE_MONTHLY_EXECUTIONS
    if organization.plan == pricing.FREE:
        if premium_feature:
            raise PremiumRequired(
                f"The '{feature}' feature needs the Premium plan ($97.00/month). "
                'An owner or admin can upgrade: POST /api/v1/billing/plan {"plan": "premium"}.'
            )
        if state.executions >= allowance:
            raise FreeAllowanceExhausted(
                f"The Free plan's {allowance:,} executions for {start:%B %Y} are used up. "
                "Upgrade to Premium (100,000 executions a month included) to continue, "
                f"or wait until {pricing.next_period_start(start):%B 1}."
            )
    cap = organization.spending_cap_cents
    if cap is not None and not pricing.cap_allows(
        organization.plan, state.executions, cap, free_allowance=allowance
    ):
        so_far = pricing.total_cents(organization.plan, state.executions, free_allowance=allowance)
        raise SpendingCapReached(
            f"This organization's monthly spending cap of {pricing.format_cents(cap)} is reached "
            f"({state.executions:,} executions, {pricing.format_cents(so_far)} so far this period). "
            "An owner or admin can raise or remove it: PUT /api/v1/billing/spending-cap."
        )


def metering_record(
    *,
    organization_id: int,
    api_key_id: int | None,
    operation: str,
    event_id: str | None = None,
    occurred_at: datetime | None = None,
) -> None:
    """Count exactly one execution for the organization (and API key) at `occurred_at` (now).

    The same `event_id` is counted once, ever: within a week by Redis, after that by the
    ledger's unique constraint. Without an event id a fresh one is generated. With Redis
    this is one round trip and takes no database lock; once it returns, the execution is
    in Redis and will reach the ledger (as long as Redis keeps its data).
    """
    if event_id is None:
        event_id = uuid.uuid4().hex
    elif len(event_id) > MAX_EVENT_ID_CHARS:
        event_id = "sha256:" + hashlib.sha256(event_id.encode()).hexdigest()
    event = MeteredEvent(
        event_id=event_id,
        organization_id=organization_id,
        api_key_id=api_key_id,
        operation=operation[:64],
        occurred_at=occurred_at or timezone.now(),
    )
    get_meter().record(event)


# --- Flush (called by services.usage_flush) --------------------------------------------------


@dataclass(frozen=True)
class FlushResult:
    """What one flush did."""

    read: int
    """Entries (Redis) or ledger rows (embedded) taken in."""
    added: int
    """Executions newly added to the ledger/rollup; duplicates are not counted here."""
    skipped: bool = False
    """Another flush held the lock; nothing was done."""


def _existing_organization_ids(ids: set[int]) -> set[int]:
    return set(Organization.objects.filter(pk__in=ids).values_list("pk", flat=True))


def flush_redis(meter: RedisMeter, *, batch_size: int, max_batches: int) -> FlushResult:
    """Move stream entries into the ledger and rollup, batch by batch; see the module docstring."""
    lock = meter.client.lock(meter.flush_lock, timeout=300, blocking=False)
    if not lock.acquire():
        return FlushResult(0, 0, skipped=True)
    read = added = 0
    try:
        for _ in range(max_batches):
            batch = meter.read_batch(batch_size)
            if not batch:
                break
            events = [event for _, event in batch if event is not None]
            if len(events) != len(batch):
                logger.error("dropping %d malformed usage stream entries", len(batch) - len(events))
            known = _existing_organization_ids({e.organization_id for e in events})
            kept = [e for e in events if e.organization_id in known]
            if len(kept) != len(events):
                logger.warning(
                    "dropping %d usage events of deleted organizations", len(events) - len(kept)
                )
            with transaction.atomic():
                new = ledger_insert(kept, aggregated_at=timezone.now())
                daily_add(daily_counts(new))
            # A crash here leaves the batch in the stream; the re-run adds nothing twice.
            meter.ack([entry_id for entry_id, _ in batch])
            read += len(batch)
            added += len(new)
            if len(batch) < batch_size:
                break
    finally:
        try:
            lock.release()
        except LockError:  # it expired: another flush may have run alongside, harmlessly
            logger.warning("usage flush lock had expired before release")
    return FlushResult(read, added)


def flush_database(*, batch_size: int, max_batches: int) -> FlushResult:
    """Move records kept on disk into the ledger, then fold ledger rows not yet aggregated
    into UsageDaily (embedded mode)."""
    spooled = list(usage_spool.spooled())
    known = _existing_organization_ids({event.organization_id for _, event in spooled})
    for batch in (spooled[i : i + batch_size] for i in range(0, len(spooled), batch_size)):
        kept = [event for _, event in batch if event.organization_id in known]
        if len(kept) != len(batch):
            logger.warning(
                "dropping %d kept usage records of deleted organizations", len(batch) - len(kept)
            )
        with transaction.atomic():
            ledger_insert(kept, aggregated_at=None)
        for path, _ in batch:  # in the ledger now; a crash before this re-inserts nothing
            path.unlink(missing_ok=True)
    read = 0
    for _ in range(max_batches):
        with transaction.atomic():
            rows = list(
                UsageEvent.objects.filter(aggregated_at__isnull=True)
                .select_for_update(skip_locked=True)
                .order_by("id")
                .values_list("id", "organization_id", "occurred_at", "api_key_id")[:batch_size]
            )
            if not rows:
                break
            counts = daily_counts(
                MeteredEvent("", org_id, key_id, "", occurred_at)
                for _, org_id, occurred_at, key_id in rows
            )
            daily_add(counts)
            UsageEvent.objects.filter(id__in=[row[0] for row in rows]).update(
                aggregated_at=timezone.now()
            )
        read += len(rows)
        if len(rows) < batch_size:
            break
    return FlushResult(read, read)


def plan_changes_apply_due(*, organization: Organization, now: datetime | None = None) -> None:
    """Apply scheduled plan changes whose time has come to Organization.plan (idempotent).
    Updates `organization` in place."""
    now = now or timezone.now()
    with transaction.atomic():
        due = list(
            PlanChange.objects.select_for_update()
            .filter(
                organization_id=organization.pk,
                applied_at__isnull=True,
                canceled_at__isnull=True,
                effective_at__lte=now,
            )
            .order_by("effective_at", "id")
        )
        if due:
            Organization.objects.filter(pk=organization.pk).update(plan=due[-1].plan)
            PlanChange.objects.filter(pk__in=[c.pk for c in due]).update(applied_at=now)
        transaction.on_commit(lambda: get_meter().flag_plan_change(organization.pk, None))
    organization.plan = Organization.objects.values_list("plan", flat=True).get(pk=organization.pk)
