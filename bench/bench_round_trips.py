"""What one round trip to PostgreSQL and to Redis costs on this host, back to back and after
a pause like the work a request does between two of its round trips.

A request of one after another (create, then a command) makes its round trips a few
milliseconds apart, with the server's own Python in between. Timed in-process, each of them
took several times what the same statement takes in a tight loop. This measures that part
of the floor: the same query, sent back to back and after a gap (spent sleeping, as a
thread waiting on the agent does, or spinning, as one running the server's Python does).
It is a property of the host (on a virtual machine, waking an idle CPU), not of Sandpit, and
it shows what each round trip a request saves is worth here.

Beside the wall time it prints the CPU time the calling thread was charged for the round
trip (time.thread_time): after a pause, that grows too, so the round trips of one after
another cost the web process CPU that a raw spawn does not spend, not only latency.

Run:  .venv/bin/python bench/bench_round_trips.py [--runs 400] [--gaps 0,1,3,10]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import psycopg
import redis
from _server import bench_env, ensure_database, percentile


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def timed(
    call: Callable[[], object], runs: int, gap_s: float, pause: Callable[[float], None]
) -> tuple[list[float], list[float]]:
    """(wall µs, the calling thread's CPU µs) of each round trip."""
    walls, cpus = [], []
    for _ in range(runs):
        if gap_s:
            pause(gap_s)
        cpu_started = time.thread_time()
        started = time.perf_counter()
        call()
        walls.append((time.perf_counter() - started) * 1e6)
        cpus.append((time.thread_time() - cpu_started) * 1e6)
    return walls, cpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--gaps", default="0,1,3,10", help="ms between round trips")
    args = parser.parse_args()
    env = bench_env()
    ensure_database(env)
    database = psycopg.connect(env["DATABASE_URL"], autocommit=True)
    cache = redis.Redis.from_url(env["REDIS_URL"])
    # A primary-key read of a real table, the shape of the API's lookups.
    table_read = "SELECT id, name, slug, plan FROM accounts_organization WHERE id = %s"
    calls: dict[str, Callable[[], object]] = {
        "PostgreSQL SELECT 1": lambda: database.execute("SELECT 1").fetchone(),
        "PostgreSQL row by key": lambda: database.execute(table_read, [1]).fetchone(),
        "Redis PING": cache.ping,
    }
    gaps = [float(gap) for gap in args.gaps.split(",") if gap]
    print("round trip, µs: wall p50 / p95 (the calling thread's CPU p50), after a gap of")
    print(" | ".join(["call", "pause", *(f"{gap:g} ms" for gap in gaps)]))
    for name, call in calls.items():
        for pause_name, pause in (("sleep", time.sleep), ("spin", spin)):
            cells = []
            for gap in gaps:
                walls, cpus = timed(call, args.runs, gap / 1000, pause)
                cells.append(
                    f"{statistics.median(walls):.0f} / {percentile(walls, 95):.0f}"
                    f" ({statistics.median(cpus):.0f})"
                )
            print(" | ".join([name, pause_name, *cells]))
    database.close()
    cache.close()


if __name__ == "__main__":
    main()
