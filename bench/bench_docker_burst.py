"""Docker create -> first `node -v` through the API, before and after the warm pool and the
create queue, each beside its raw floor (`docker run --rm IMAGE node -v`) in the same run.

Two servers one after the other on the same machine: "off" (SANDPIT_DOCKER_POOL_SIZE=0,
SANDPIT_DOCKER_CREATE_CONCURRENCY=0: every create starts a container, all at once) and
"on" (the given pool size and queue). For each: one after another, then N at once; the
floor is measured beside each phase (interleaved one after another; its own burst right
before the product's burst). The pool refills between samples (pauses), so its refill
does not slow the floor down; a burst larger than the pool goes cold for the rest.

Run:  .venv/bin/python bench/bench_docker_burst.py [--sequential 10] [--burst 50]
      [--pool 4] [--concurrency 3] [--only on|off] [--bursts N] [--pool-max M]
--bursts N repeats the burst, each after the engine's container count held still: the pool
grows to the bursts it saw, up to --pool-max (SANDPIT_DOCKER_POOL_MAX; server default 32).
Only the ratios travel between machines.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import httpx
from _server import bench_env, create_org_and_key, daphne, ensure_database
from bench_burst import IMAGE, _row, destroy_all, floor_once, product_once

PAUSE_S = 1.0
"""Between samples: lets the pool refill so refilling does not overlap the next floor."""


async def measure(port: int, key: str, args: argparse.Namespace) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    limits = httpx.Limits(max_connections=args.burst + 10, max_keepalive_connections=args.burst)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}",
        headers={"Authorization": f"Bearer {key}"},
        timeout=300,
        limits=limits,
    ) as client:
        created: list[str] = []
        for _ in range(3):  # warm-up; the first create also starts filling the pool
            await product_once(client, "docker", created)
            await floor_once("docker")
        await destroy_all(client, created)
        await asyncio.sleep(PAUSE_S * 3)

        product: list[float] = []
        floor: list[float] = []
        for _ in range(args.sequential):
            product.append(await product_once(client, "docker", created))
            await asyncio.sleep(PAUSE_S)
            floor.append(await floor_once("docker"))
        await destroy_all(client, created)
        rows.append(("one after another", *_row(product, floor)))
        await asyncio.sleep(PAUSE_S * 3)

        for burst in range(1, args.bursts + 1):
            if burst > 1:  # the pool grows to the burst it saw (burst_sizing.py): let it
                await containers_settled()
            floor = list(await asyncio.gather(*(floor_once("docker") for _ in range(args.burst))))
            await asyncio.sleep(PAUSE_S * 3)
            results = await asyncio.gather(
                *(product_once(client, "docker", created) for _ in range(args.burst)),
                return_exceptions=True,
            )
            errors = [r for r in results if isinstance(r, BaseException)]
            product = [r for r in results if isinstance(r, float)]
            await destroy_all(client, created)
            name = f"{args.burst} at once{f' #{burst}' if args.bursts > 1 else ''}"
            rows.append((f"{name} ({len(errors)} errors)", *_row(product, floor)))
            for error in errors[:3]:
                print("error:", error)
    return rows


async def containers_settled() -> None:
    """Until the engine's number of running containers held still for 3 s (or 180 s)."""
    deadline = time.monotonic() + 180
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        ps = await asyncio.create_subprocess_exec(
            "docker", "ps", "-q", stdout=asyncio.subprocess.PIPE
        )
        out, _ = await ps.communicate()
        running = len(out.split())
        if running != last:
            last, since = running, time.monotonic()
        elif time.monotonic() - since >= 3:
            return
        await asyncio.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequential", type=int, default=10)
    parser.add_argument("--burst", type=int, default=50)
    parser.add_argument("--pool", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=3)
    parser.add_argument("--only", choices=["on", "off"])
    parser.add_argument("--bursts", type=int, default=1)
    parser.add_argument("--pool-max", type=int, default=None)
    args = parser.parse_args()
    configs = {"off": (0, 0), "on": (args.pool, args.concurrency)}
    table: list[tuple[str, ...]] = []
    for label, (pool, concurrency) in configs.items():
        if args.only and label != args.only:
            continue
        env = bench_env(
            {
                "SANDPIT_PROVIDERS": "local,docker",
                "SANDPIT_DOCKER_IMAGE": IMAGE,
                "SANDPIT_MAX_CONCURRENT_SANDBOXES": str(max(200, args.burst * 2)),
                "SANDPIT_DOCKER_POOL_SIZE": str(pool),
                "SANDPIT_DOCKER_CREATE_CONCURRENCY": str(concurrency),
                **(
                    {} if args.pool_max is None else {"SANDPIT_DOCKER_POOL_MAX": str(args.pool_max)}
                ),
            }
        )
        ensure_database(env)
        key = create_org_and_key(env, slug="bench-docker-burst")
        with daphne(env) as port:
            rows = asyncio.run(measure(port, key, args))
        name = f"pool {pool}, queue {concurrency or 'off'}"
        table += [(name, *row) for row in rows]
    print("\ndocker: create -> first `node -v` (ms), floor = raw `docker run --rm node -v`")
    print(" | ".join(("server", "measure", "p50", "p95", "floor p50", "floor p95", "p50 ratio")))
    for row in table:
        print(" | ".join(row))


if __name__ == "__main__":
    main()
