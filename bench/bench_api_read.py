"""An API read that touches no provider (GET /api/v1/sandboxes/{id}) beside a bare "hello"
endpoint served by the same stack (daphne, Django's ASGI handler, the same middleware) in
the same run: what authentication, the ORM, DRF and rendering cost on top of serving HTTP.

Run:  .venv/bin/python bench/bench_api_read.py [--runs 400] [--clients 1,10]
                                               [--stock-middleware] [--compare-checkout DIR]
With `--clients N`, N keep-alive connections ask at once (each a thread), hello and read
rounds interleaved so a drifting machine moves both alike. Issue 18's target: read p50 at
most 2x hello's. The hello endpoint lives only in the bench's server (bench/_bench_asgi.py).
A second table gives the web processes' CPU per request for each (from /proc): latency on
this shared machine swings with its neighbours' load, CPU per request much less; a third
their threads' context switches per request.

More servers can be measured in the same run, their rounds interleaved with the product's:
`--stock-middleware` serves the same code with Django's stock middleware in place of the
inline subclasses of playground/middleware.py (bench/_bench_settings_stock.py), which shows
what the thread hops of stock middleware under ASGI cost; `--compare-checkout DIR` serves
another checkout (e.g. `git worktree add /tmp/before <commit>`) for before/after figures.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from _server import (
    ROOT,
    Api,
    bench_env,
    create_org_and_key,
    daphne,
    ensure_database,
    percentile,
    process_context_switches,
    process_user_and_system_cpu_s,
    web_processes,
)


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


@dataclass
class Served:
    """One server of the run and what it measured."""

    label: str
    port: int = 0
    read: str = ""
    hello: dict[int, list[float]] = field(default_factory=dict)
    reads: dict[int, list[float]] = field(default_factory=dict)
    cpu_s: dict[tuple[int, str], float] = field(default_factory=dict)
    """The web processes' CPU seconds while (clients, "hello" or "read") was measured."""
    system_cpu_s: dict[tuple[int, str], float] = field(default_factory=dict)
    """The part of `cpu_s` spent in the kernel."""
    switches: dict[tuple[int, str], tuple[int, int]] = field(default_factory=dict)
    """Their threads' voluntary and involuntary context switches over the same calls."""

    def timed(self, key: str, path: str, clients: int, runs: int, which: str) -> list[float]:
        """timed_calls, adding the web processes' CPU over the calls to `cpu_s`."""
        pids = web_processes(self.port)
        before = [process_user_and_system_cpu_s(pid) for pid in pids]
        switches_before = [process_context_switches(pid) for pid in pids]
        samples = timed_calls(self.port, key, path, clients, runs)
        after = [process_user_and_system_cpu_s(pid) for pid in pids]
        user = sum(now[0] - was[0] for now, was in zip(after, before, strict=True))
        system = sum(now[1] - was[1] for now, was in zip(after, before, strict=True))
        self.cpu_s[clients, which] = self.cpu_s.get((clients, which), 0.0) + user + system
        self.system_cpu_s[clients, which] = self.system_cpu_s.get((clients, which), 0.0) + system
        voluntary, involuntary = self.switches.get((clients, which), (0, 0))
        for pid, (was_voluntary, was_involuntary) in zip(pids, switches_before, strict=True):
            now_voluntary, now_involuntary = process_context_switches(pid)
            voluntary += now_voluntary - was_voluntary
            involuntary += now_involuntary - was_involuntary
        self.switches[clients, which] = (voluntary, involuntary)
        return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--clients", default="1,10")
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds per measure")
    parser.add_argument(
        "--stock-middleware",
        action="store_true",
        help="also serve with Django's stock middleware (same code, same run)",
    )
    parser.add_argument(
        "--compare-checkout",
        type=Path,
        help="also serve this checkout of the project (before/after in the same run)",
    )
    args = parser.parse_args()
    # No warm pool: its refill would compete with the reads (nothing here needs a warm jail).
    env = bench_env({"SANDPIT_LOCAL_WARM_POOL": "0"})
    ensure_database(env)
    key = create_org_and_key(env, slug="bench-read")
    setups: list[tuple[str, dict[str, str], Path]] = [("this checkout", env, ROOT)]
    if args.stock_middleware:
        stock = {**env, "DJANGO_SETTINGS_MODULE": "_bench_settings_stock"}
        setups.append(("stock middleware", stock, ROOT))
    if args.compare_checkout:
        setups.append((f"checkout {args.compare_checkout}", env, args.compare_checkout.resolve()))
    clients = [int(n) for n in args.clients.split(",") if n]
    per_round = max(1, args.runs // args.rounds)
    with ExitStack() as stack:
        served = []
        for label, server_env, root in setups:
            one = Served(label)
            one.port = stack.enter_context(
                daphne(server_env, app="_bench_asgi:application", root=root)
            )
            api = Api(one.port, key)
            status, body = api.call("POST", "/api/v1/sandboxes", {"provider": "local"})
            if status != 201 or not isinstance(body, dict):
                raise SystemExit(f"{label}: create: {status} {body!r}")
            one.read = f"/api/v1/sandboxes/{body['id']}"
            # Destroyed while its server still runs (callbacks run before the servers stop).
            stack.callback(lambda port=one.port, read=one.read: Api(port, key).call("DELETE", read))
            timed_calls(one.port, key, "/bench/hello", 1, 50)  # warm-up
            timed_calls(one.port, key, one.read, 1, 50)
            served.append(one)
        for n in clients:
            for _ in range(args.rounds):
                for one in served:
                    one.hello.setdefault(n, []).extend(
                        one.timed(key, "/bench/hello", n, per_round, "hello")
                    )
                    one.reads.setdefault(n, []).extend(
                        one.timed(key, one.read, n, per_round, "read")
                    )
    print("\nGET, ms per request (rounds of every server interleaved, same run)")
    print("server | clients | hello p50 | hello p95 | read p50 | read p95 | p50 ratio")
    for n in clients:
        for one in served:
            hello, reads = one.hello[n], one.reads[n]
            h50, r50 = statistics.median(hello), statistics.median(reads)
            print(
                f"{one.label} | {n} | {h50:.2f} | {percentile(hello, 95):.2f} | {r50:.2f} | "
                f"{percentile(reads, 95):.2f} | {r50 / h50:.2f}x"
            )
    print("\nTarget (issue 18): read p50 <= 2x hello p50 (each server's own hello).")
    print("\nWeb processes' CPU per request, us (their background threads included)")
    print("server | clients | hello | read | ratio | hello in the kernel | read in the kernel")
    for n in clients:
        for one in served:
            hello_us = one.cpu_s[n, "hello"] * 1e6 / len(one.hello[n])
            read_us = one.cpu_s[n, "read"] * 1e6 / len(one.reads[n])
            hello_system_us = one.system_cpu_s[n, "hello"] * 1e6 / len(one.hello[n])
            read_system_us = one.system_cpu_s[n, "read"] * 1e6 / len(one.reads[n])
            print(
                f"{one.label} | {n} | {hello_us:.0f} | {read_us:.0f} | "
                f"{read_us / hello_us:.2f}x | {hello_system_us:.0f} | {read_system_us:.0f}"
            )
    # Each switch costs the process CPU, and in a busy process most are threads taking turns
    # with the GIL around system calls that let go of it.
    print("\nContext switches per request (voluntary + involuntary) of the web processes' threads")
    print("server | clients | hello | read")
    for n in clients:
        for one in served:
            cells = []
            for which, samples in (("hello", one.hello[n]), ("read", one.reads[n])):
                voluntary, involuntary = one.switches[n, which]
                cells.append(f"{voluntary / len(samples):.1f} + {involuntary / len(samples):.1f}")
            print(f"{one.label} | {n} | {cells[0]} | {cells[1]}")


if __name__ == "__main__":
    main()
