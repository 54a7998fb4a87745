"""An API read that touches no provider (GET /api/v1/sandboxes/{id}) beside a bare "hello"
endpoint served by the same stack (daphne, Django's ASGI handler, the same middleware) in
the same run: what authentication, the ORM, DRF and rendering cost on top of serving HTTP.

Run:  .venv/bin/python bench/bench_api_read.py [--runs 400] [--clients 1,10]
With `--clients N`, N keep-alive connections ask at once (each a thread), hello and read
rounds interleaved so a drifting machine moves both alike. Issue 18's target: read p50 at
most 2x hello's. The hello endpoint lives only in the bench's server (bench/_bench_asgi.py).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from _server import Api, bench_env, create_org_and_key, daphne, ensure_database, percentile


def timed_calls(port: int, key: str, path: str, clients: int, runs: int) -> list[float]:
    """`runs` GETs of `path` per client, `clients` connections at once; ms per call."""
    samples: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(clients)

    def client() -> None:
        api = Api(port, key)
        api.call("GET", path)  # connect outside the timing
        mine = []
        barrier.wait()
        for _ in range(runs):
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
    for thread in threads:
        thread.join()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--clients", default="1,10")
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds per measure")
    args = parser.parse_args()
    # No warm pool: its refill would compete with the reads (nothing here needs a warm jail).
    env = bench_env({"SANDPIT_LOCAL_WARM_POOL": "0"})
    ensure_database(env)
    key = create_org_and_key(env, slug="bench-read")
    with daphne(env, app="_bench_asgi:application") as port:
        api = Api(port, key)
        status, body = api.call("POST", "/api/v1/sandboxes", {"provider": "local"})
        if status != 201 or not isinstance(body, dict):
            raise SystemExit(f"create: {status} {body!r}")
        read = f"/api/v1/sandboxes/{body['id']}"
        try:
            timed_calls(port, key, "/bench/hello", 1, 50)  # warm-up
            timed_calls(port, key, read, 1, 50)
            print("\nGET, ms per request (same server, same run)")
            print("clients | hello p50 | hello p95 | read p50 | read p95 | p50 ratio")
            for clients in [int(n) for n in args.clients.split(",") if n]:
                hello: list[float] = []
                reads: list[float] = []
                per_round = max(1, args.runs // args.rounds)
                for _ in range(args.rounds):
                    hello += timed_calls(port, key, "/bench/hello", clients, per_round)
                    reads += timed_calls(port, key, read, clients, per_round)
                h50, r50 = statistics.median(hello), statistics.median(reads)
                print(
                    f"{clients} | {h50:.2f} | {percentile(hello, 95):.2f} | {r50:.2f} | "
                    f"{percentile(reads, 95):.2f} | {r50 / h50:.2f}x"
                )
        finally:
            api.call("DELETE", read)
    print("\nTarget (issue 18): read p50 <= 2x hello p50.")


if __name__ == "__main__":
    main()
