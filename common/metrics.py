"""Metric counters and the HTTP latency histogram that /metrics (playground/metrics.py) exposes:
reaper runs and reaped sandboxes, provider errors, request latencies by route.

Counters and the histogram must add up across every web and worker process, so they live
in one shared store: a Redis hash when REDIS_URL is set (HINCRBY is atomic), otherwise a
small JSON file under SANDPIT_VAR_DIR guarded by an fcntl lock (embedded mode runs on one
machine). Request latencies are buffered in-process and flushed at most once a second, so
a request pays no extra round trip.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import redis
from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponse

logger = logging.getLogger(__name__)

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
FLUSH_INTERVAL_S = 1.0

COUNTERS: dict[str, str] = {
    "reaper_runs": "Reaper and reconciler runs, by task.",
    "sandboxes_reaped": "Sandboxes destroyed by the reaper or reconciler, by reason.",
    "provider_errors": "Provider calls that failed, by provider and operation.",
    "sandboxes_lost": "Sandboxes marked error because their Docker engine stopped answering.",
}

LabelKey = tuple[tuple[str, str], ...]


def _field(name: str, labels: LabelKey) -> str:
    return name + "|" + ",".join(f"{k}={v}" for k, v in labels)


def _parse_field(raw: str) -> tuple[str, LabelKey]:
    name, _, rest = raw.partition("|")
    labels = tuple(tuple(part.split("=", 1)) for part in rest.split(",") if part)
    return name, labels  # type: ignore[return-value]


# --- stores --------------------------------------------------------------------------------


class _RedisStore:
    def __init__(self, url: str, prefix: str) -> None:
        self._client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        self._counters = f"{prefix}:metrics:counters"
        self._latency = f"{prefix}:metrics:latency"

    def incr(self, field: str, amount: int) -> None:
        self._client.hincrby(self._counters, field, amount)

    def add_latency(self, values: dict[str, float]) -> None:
        pipe = self._client.pipeline(transaction=False)
        for key, value in values.items():
            if key.endswith("|sum"):
                pipe.hincrbyfloat(self._latency, key, value)
            else:
                pipe.hincrby(self._latency, key, int(value))
        pipe.execute()

    def read(self) -> tuple[dict[str, float], dict[str, float]]:
        pipe = self._client.pipeline(transaction=False)
        pipe.hgetall(self._counters)
        pipe.hgetall(self._latency)
        counters, latency = pipe.execute()
        decode = lambda d: {k.decode(): float(v) for k, v in d.items()}  # noqa: E731
        return decode(counters), decode(latency)


class _FileStore:
    """One machine, several processes: a JSON document rewritten under an exclusive lock."""

    def __init__(self, path: Path) -> None:
        self._path = path

    def _update(self, fn: Callable[[dict[str, dict[str, float]]], None]) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        with open(self._path, "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            handle.seek(0)
            try:
                data = json.loads(handle.read() or "{}")
            except ValueError:
                data = {}
            data.setdefault("counters", {})
            data.setdefault("latency", {})
            fn(data)
            handle.seek(0)
            handle.truncate()
            handle.write(json.dumps(data))

    def incr(self, field: str, amount: int) -> None:
        def apply(data: dict[str, dict[str, float]]) -> None:
            data["counters"][field] = data["counters"].get(field, 0) + amount

        self._update(apply)

    def add_latency(self, values: dict[str, float]) -> None:
        def apply(data: dict[str, dict[str, float]]) -> None:
            for key, value in values.items():
                data["latency"][key] = data["latency"].get(key, 0) + value

        self._update(apply)

    def read(self) -> tuple[dict[str, float], dict[str, float]]:
        try:
            with open(self._path) as handle:
                fcntl.flock(handle, fcntl.LOCK_SH)
                data = json.loads(handle.read() or "{}")
        except (OSError, ValueError):
            data = {}
        return data.get("counters", {}), data.get("latency", {})


_store_lock = threading.Lock()
_store: Any = None
_store_key: tuple[str, ...] | None = None


def _get_store() -> Any:
    """The shared store for the current settings (rebuilt when tests change them)."""
    global _store, _store_key
    redis_url = getattr(settings, "REDIS_URL", "")
    prefix = str(settings.CACHES.get("default", {}).get("KEY_PREFIX") or "sandpit")
    path = str(Path(getattr(settings, "VAR_DIR", "var")) / "metrics.json")
    key = (redis_url, prefix, path)
    with _store_lock:
        if _store is None or _store_key != key:
            _store = _RedisStore(redis_url, prefix) if redis_url else _FileStore(Path(path))
            _store_key = key
        return _store


# --- counters -----------------------------------------------------------------------------


def counter_inc(name: str, amount: int = 1, **labels: str) -> None:
    """Add to a shared counter (see COUNTERS). Never raises: metrics must not break work."""
    field = _field(name, tuple(sorted((k, str(v)) for k, v in labels.items())))
    try:
        _get_store().incr(field, amount)
    except Exception:  # noqa: BLE001 - a metrics outage is logged, never propagated
        logger.warning("could not record metric %s", name, exc_info=True)


def counter_values(name: str) -> dict[LabelKey, float]:
    """Current totals of one counter, by label set (for tests and the admin)."""
    counters, _ = _get_store().read()
    out: dict[LabelKey, float] = {}
    for raw, value in counters.items():
        parsed, labels = _parse_field(raw)
        if parsed == name:
            out[labels] = value
    return out


# --- latency histogram ----------------------------------------------------------------------


class _LatencyBuffer:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, float] = defaultdict(float)
        self._last_flush = time.monotonic()

    def observe(self, handler: str, method: str, seconds: float, flush: bool = True) -> bool:
        """Record one request; flushes to the shared store about once a second (or, with
        flush=False, returns whether the caller should flush, e.g. off the event loop)."""
        base = f"{handler}|{method}"
        bucket = next((str(b) for b in LATENCY_BUCKETS_S if seconds <= b), "+Inf")
        with self._lock:
            self._pending[f"{base}|{bucket}"] += 1
            self._pending[f"{base}|count"] += 1
            self._pending[f"{base}|sum"] += seconds
            now = time.monotonic()
            due = now - self._last_flush >= FLUSH_INTERVAL_S
            if due:
                # Claimed here, not when the flush runs: with flush=False it runs later on
                # another thread, and every request until then would be told to flush too.
                self._last_flush = now
        if due and flush:
            self.flush()
        return due

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = dict(self._pending), defaultdict(float)
            self._last_flush = time.monotonic()
        if not pending:
            return
        try:
            _get_store().add_latency(pending)
        except Exception:  # noqa: BLE001 - dropped on a store outage, never fails a request
            logger.warning("could not flush latency metrics", exc_info=True)


latency = _LatencyBuffer()


class LatencyMiddleware:
    """Times every HTTP request into the shared histogram, labelled by URL route (bounded
    cardinality: the route pattern, not the path) and method."""

    sync_capable = True
    async_capable = True  # keeps the ASGI middleware chain async (one thread hop per request)

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if iscoroutinefunction(self):
            return self.__acall__(request)
        started = time.perf_counter()
        response = self.get_response(request)
        self._observe(request, started)
        return response

    async def __acall__(self, request: HttpRequest) -> HttpResponse:
        started = time.perf_counter()
        response = await self.get_response(request)  # type: ignore[misc]
        if self._observe(request, started, flush=False):
            # The store is Redis or a file: write it from a thread, not the event loop.
            asyncio.get_running_loop().run_in_executor(None, latency.flush)
        return response

    @staticmethod
    def _observe(request: HttpRequest, started: float, flush: bool = True) -> bool:
        match = getattr(request, "resolver_match", None)
        handler = (match.route or match.view_name) if match is not None else "unmatched"
        method = request.method if request.method in _METHODS else "OTHER"
        return latency.observe(
            handler or "unmatched", method, time.perf_counter() - started, flush=flush
        )


_METHODS = {"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"}


# --- exposition -----------------------------------------------------------------------------


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def label_text(pairs: Iterable[tuple[str, str]]) -> str:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)
    return "{" + inner + "}" if inner else ""


def number_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def counter_lines(counters: dict[str, float]) -> list[str]:
    grouped: dict[str, list[tuple[LabelKey, float]]] = defaultdict(list)
    for raw, value in counters.items():
        name, labels = _parse_field(raw)
        if name in COUNTERS:
            grouped[name].append((labels, value))
    lines: list[str] = []
    for name, help_text in COUNTERS.items():
        metric = f"sandpit_{name}_total"
        lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} counter"]
        for labels, value in sorted(grouped.get(name, [])):
            lines.append(f"{metric}{label_text(labels)} {number_text(value)}")
    return lines


def latency_lines(raw: dict[str, float]) -> list[str]:
    series: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for key, value in raw.items():
        handler, method, part = key.rsplit("|", 2)
        series[(handler, method)][part] = value
    metric = "sandpit_http_request_duration_seconds"
    lines = [
        f"# HELP {metric} HTTP request latency, by route and method.",
        f"# TYPE {metric} histogram",
    ]
    for (handler, method), parts in sorted(series.items()):
        base = [("handler", handler), ("method", method)]
        cumulative = 0.0
        for bucket in [*(str(b) for b in LATENCY_BUCKETS_S), "+Inf"]:
            cumulative += parts.get(bucket, 0)
            lines.append(
                f"{metric}_bucket{label_text([*base, ('le', bucket)])} {number_text(cumulative)}"
            )
        lines.append(f"{metric}_sum{label_text(base)} {parts.get('sum', 0.0)!r}")
        lines.append(f"{metric}_count{label_text(base)} {number_text(parts.get('count', 0))}")
    return lines


def read_store() -> tuple[dict[str, float], dict[str, float]]:
    """Every process's counters and latency parts, this process's buffer flushed first."""
    latency.flush()
    return _get_store().read()


def reset_for_tests() -> None:
    """Forget the cached store and buffered latencies (tests that change settings)."""
    global _store, _store_key
    with _store_lock:
        _store, _store_key = None, None
    latency.flush()
