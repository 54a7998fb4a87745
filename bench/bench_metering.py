"""What metering costs, measured in one run.

1. Directly: per-call latency of metering_authorize and metering_record (Redis backend,
   and the embedded database backend for reference).
2. Over HTTP against daphne: the same metered endpoint (GET files/stat) served with
   metering on and with metering stubbed out, plus an unmetered endpoint
   (GET /api/v1/organization), sequentially (p50/p95 latency) and with concurrent
   keep-alive clients (throughput).

Usage (a migrated database; the bench creates and deletes its own organization):
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/sandpit REDIS_URL=redis://127.0.0.1:6379/15 \
        .venv/bin/python bench/bench_metering.py [--direct 10000] [--http 500] [--clients 8]
Target: metering adds < 1 ms per call at p50.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "playground.settings")
os.environ.setdefault("SANDPIT_INSTALLATION", f"bench-{uuid.uuid4().hex[:8]}")


def serve(port: int, metering: bool) -> None:
    """Run daphne in this process, optionally with metering stubbed out of the sandbox API."""
    import django

    django.setup()
    if not metering:
        import sandboxes.apis

        sandboxes.apis.metering_authorize = lambda **kwargs: None  # type: ignore[assignment]
        sandboxes.apis.metering_record = lambda **kwargs: None  # type: ignore[assignment]
    from daphne.cli import CommandLineInterface

    CommandLineInterface().run(["-b", "127.0.0.1", "-p", str(port), "playground.asgi:application"])


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed(call: Callable[[], object], n: int) -> list[float]:
    """Per-call wall time in ms."""
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def row(name: str, samples: list[float], total_s: float | None = None) -> str:
    rate = len(samples) / total_s if total_s else 1000 / statistics.mean(samples)
    return (
        f"| {name:<46} | {len(samples):>6} | {percentile(samples, 0.5):>7.3f} | "
        f"{percentile(samples, 0.95):>7.3f} | {rate:>9.0f} |"
    )


def concurrent(
    url: str, headers: dict[str, str], clients: int, per_client: int
) -> tuple[list[float], float]:
    """`clients` keep-alive clients each making `per_client` calls: (latencies, wall seconds)."""
    import httpx

    samples: list[float] = []
    lock = threading.Lock()

    def client() -> None:
        with httpx.Client(headers=headers, timeout=120) as http:
            mine = timed(lambda: http.get(url).raise_for_status(), per_client)
        with lock:
            samples.extend(mine)

    start = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return samples, time.perf_counter() - start


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--direct", type=int, default=10_000)
    parser.add_argument("--http", type=int, default=500)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()

    import logging

    import django

    django.setup()
    import httpx
    import redis

    logging.getLogger("httpx").setLevel(logging.WARNING)
    from django.conf import settings

    from accounts.models import Organization
    from accounts.services import api_key_create
    from billing import metering, services
    from billing.metering import metering_authorize, metering_record

    if not settings.REDIS_URL:
        sys.exit("set REDIS_URL (and DATABASE_URL) to benchmark the production path")
    slug = f"bench-{uuid.uuid4().hex[:8]}"
    org = Organization.objects.create(
        name="bench", slug=slug, plan="premium", spending_cap_cents=10**9
    )
    free = Organization.objects.create(name="bench free", slug=slug + "-free", plan="free")
    secret = api_key_create(organization=org, name="bench", created_by=None).secret
    key_id = org.api_keys.get().pk
    settings.SANDPIT_FREE_MONTHLY_EXECUTIONS = 10**9
    lines = [
        "| what                                           |  calls | p50 ms  | p95 ms  | calls/s   |",
        "|------------------------------------------------|--------|---------|---------|-----------|",
    ]
    daphnes: list[subprocess.Popen[bytes]] = []
    tmp = tempfile.mkdtemp(prefix="bench-metering-", dir="/tmp")  # short: AF_UNIX path limit
    try:
        # 1. Direct --------------------------------------------------------------------------
        timed(
            lambda: metering_record(organization_id=org.pk, api_key_id=key_id, operation="bench"),
            200,
        )
        rec = timed(
            lambda: metering_record(organization_id=org.pk, api_key_id=key_id, operation="bench"),
            args.direct,
        )
        auth_cap = timed(lambda: metering_authorize(organization=org, feature="files"), args.direct)
        auth_free = timed(
            lambda: metering_authorize(organization=free, feature="files"), args.direct
        )
        both = [a + b for a, b in zip(auth_cap, rec, strict=True)]
        lines += [
            row("metering_record (Redis, 1 Lua call)", rec),
            row("metering_authorize premium+cap (Redis MGET)", auth_cap),
            row("metering_authorize free plan (Redis MGET)", auth_free),
            row("authorize + record per metered call", both),
        ]
        flush_start = time.perf_counter()
        flushed = services.usage_flush(max_batches=10_000)
        flush_s = time.perf_counter() - flush_start
        redis_url = settings.REDIS_URL
        settings.REDIS_URL = ""
        n_db = max(1, args.direct // 5)
        rec_db = timed(
            lambda: metering_record(organization_id=org.pk, api_key_id=key_id, operation="bench"),
            n_db,
        )
        lines.append(row("metering_record (embedded: DB insert)", rec_db))
        settings.REDIS_URL = redis_url

        # 2. HTTP ------------------------------------------------------------------------------
        env = dict(
            os.environ,
            SANDPIT_API_RATE="100000000/min",
            SANDPIT_LOCAL_ROOT=f"{tmp}/sandboxes",
            SANDPIT_VAR_DIR=f"{tmp}/var",
            SANDPIT_LOG_LEVEL="WARNING",
        )
        bases = {}
        for label, flag in (("metered", "on"), ("unmetered", "off")):
            port = free_port()
            daphnes.append(
                subprocess.Popen(
                    [sys.executable, __file__, "--serve", str(port), flag],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            bases[label] = f"http://127.0.0.1:{port}"
        for base in bases.values():
            for _ in range(300):
                try:
                    httpx.get(f"{base}/health/live", timeout=1)
                    break
                except httpx.TransportError:
                    time.sleep(0.1)
        headers = {"Authorization": f"Bearer {secret}"}
        created = httpx.post(
            f"{bases['metered']}/api/v1/sandboxes", json={}, headers=headers, timeout=60
        )
        created.raise_for_status()
        sandbox_path = f"/api/v1/sandboxes/{created.json()['id']}/files/stat?path=."
        http_rows: dict[str, list[float]] = {}
        targets = (
            ("GET /organization (unmetered)", bases["metered"], "/api/v1/organization"),
            ("files/stat, metering stubbed", bases["unmetered"], sandbox_path),
            ("files/stat, metered", bases["metered"], sandbox_path),
        )
        clients = {name: httpx.Client(headers=headers, timeout=60) for name, _, _ in targets}
        for name, base, path in targets:
            for _ in range(20):
                clients[name].get(base + path).raise_for_status()
            http_rows[name] = []
        rounds = 10  # interleaved, so drift in machine load hits every target alike
        for _ in range(rounds):
            for name, base, path in targets:
                http = clients[name]
                http_rows[name] += timed(
                    lambda http=http, url=base + path: http.get(url).raise_for_status(),
                    max(1, args.http // rounds),
                )
        for name, _, _ in targets:
            clients[name].close()
            lines.append(row(f"HTTP 1 client: {name}"[:46], http_rows[name]))
        for name, base, path in (
            ("stat, metering stubbed", bases["unmetered"], sandbox_path),
            ("stat, metered", bases["metered"], sandbox_path),
        ):
            samples, elapsed = concurrent(
                base + path, headers, args.clients, max(1, args.http // args.clients)
            )
            lines.append(row(f"HTTP {args.clients} clients: {name}"[:46], samples, elapsed))
        httpx.delete(
            f"{bases['metered']}/api/v1/sandboxes/{created.json()['id']}",
            headers=headers,
            timeout=60,
        )
        metered = percentile(http_rows["files/stat, metered"], 0.5)
        stubbed = percentile(http_rows["files/stat, metering stubbed"], 0.5)
    finally:
        for process in daphnes:
            process.terminate()
            process.wait(10)
        client_ = redis.Redis.from_url(os.environ.get("REDIS_URL", ""))
        keys = list(client_.scan_iter(match=f"{metering.key_prefix()}:*"))
        if keys:
            client_.delete(*keys)
        org.delete()
        free.delete()
        shutil.rmtree(tmp, ignore_errors=True)

    print(
        f"\nload average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; python {sys.version.split()[0]}\n"
    )
    print("\n".join(lines))
    print(
        f"\ndirect: authorize+record p50 = {percentile(both, 0.5):.3f} ms (target < 1 ms); "
        f"flush moved {flushed.added:,} events in {flush_s:.2f} s ({flushed.added / flush_s:,.0f}/s)"
    )
    print(
        f"HTTP: files/stat p50 metered {metered:.2f} ms vs stubbed {stubbed:.2f} ms: +{metered - stubbed:.2f} ms"
    )


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "--serve":
        serve(int(sys.argv[2]), sys.argv[3] == "on")
    else:
        main()
