"""What several web processes buy: the same API read (GET /api/v1/sandboxes/{id}, no
provider call) and the bench's bare "hello", served by one daphne (the floor) and by the
product's launcher with N processes on one port (playground/webprocs.py), side by side in
the same run, rounds interleaved so a drifting machine moves both alike.

Run:  .venv/bin/python bench/bench_web_processes.py [--processes 0] [--clients 16]
      [--requests 2000] [--rounds 4]
--processes 0 is one per core (what SANDPIT_WEB_PROCESSES=auto serves with Redis).
Clients are threads of this process on keep-alive connections: on a small machine they
take a core's share too, so the ratio is a floor of what a separate load balancer sees.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

from _server import Api, bench_env, create_org_and_key, daphne, ensure_database, percentile


def load(port: int, key: str, path: str, clients: int, requests: int) -> tuple[float, list[float]]:
    """`requests` GETs of `path` spread over `clients` connections at once: (requests per
    second over the whole burst, ms per request)."""
    samples: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(clients + 1)
    each = max(1, requests // clients)

    def client() -> None:
        api = Api(port, key)
        api.call("GET", path)  # connect outside the timing
        mine = []
        barrier.wait()
        for _ in range(each):
            started = time.perf_counter()
            status, _ = api.call("GET", path)
            mine.append((time.perf_counter() - started) * 1000)
            if status != 200:
                raise RuntimeError(f"GET {path}: {status}")
        with lock:
            samples.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    return len(samples) / (time.perf_counter() - started), samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=0, help="0: one per core")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=2000, help="per measure and round")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    processes = args.processes or len(os.sched_getaffinity(0))
    env = bench_env({"SANDPIT_LOCAL_WARM_POOL": "0"})
    ensure_database(env)
    key = create_org_and_key(env, slug="bench-procs")
    app = "_bench_asgi:application"
    with daphne(env, app=app) as one, daphne(env, app=app, processes=processes) as many:
        made = Api(one, key).call("POST", "/api/v1/sandboxes", {"provider": "local"})
        if made[0] != 201 or not isinstance(made[1], dict):
            raise SystemExit(f"create: {made}")
        read = f"/api/v1/sandboxes/{made[1]['id']}"
        try:
            for port in (one, many):  # warm-up: every process of each has started
                for path in ("/bench/hello", read):
                    load(port, key, path, args.clients, args.clients * 20)
            results: dict[tuple[str, int], list[tuple[float, list[float]]]] = {}
            for _ in range(args.rounds):
                for path in ("/bench/hello", read):
                    for port in (one, many):
                        key_ = (path, port)
                        run = load(port, key, path, args.clients, args.requests)
                        results.setdefault(key_, []).append(run)
            print(
                f"\n{args.clients} clients, {args.rounds} interleaved rounds of "
                f"{args.requests} requests; 1 process (floor) vs {processes}"
            )
            print("endpoint | processes | req/s (median of rounds) | p50 ms | p95 ms | req/s ratio")
            for path, label in (("/bench/hello", "hello"), (read, "API read")):
                floor = statistics.median(r for r, _ in results[(path, one)])
                for port, count in ((one, 1), (many, processes)):
                    rates = [r for r, _ in results[(path, port)]]
                    samples = [s for _, ms in results[(path, port)] for s in ms]
                    rate = statistics.median(rates)
                    print(
                        f"{label} | {count} | {rate:.0f} | {statistics.median(samples):.2f} | "
                        f"{percentile(samples, 95):.2f} | {rate / floor:.2f}x"
                    )
        finally:
            Api(one, key).call("DELETE", read)


if __name__ == "__main__":
    main()
