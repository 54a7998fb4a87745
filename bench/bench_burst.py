"""Bursts: time from create to the first `node -v`, through the API, one after another and
many at once, each beside its raw floor measured in the same run.

  local:  API create -> POST /commands `node -v`   vs  `bwrap ... node -v`
  docker: API create -> POST /commands `node -v`   vs  `docker run --rm IMAGE node -v`

Run:  .venv/bin/python bench/bench_burst.py [--provider local|docker] [--sequential 20]
      [--burst 100] [--warm-pool N] [--processes N]
--warm-pool sets SANDPIT_LOCAL_WARM_POOL (per web process; default: the server's default),
and each measure then starts once the pools are full again; --processes runs that many web
processes on the port (SANDPIT_WEB_PROCESSES).
Only the ratios travel between machines (this one's speed drifts); the hosted figures printed
at the end are other products' published numbers, for context only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from _server import bench_env, create_org_and_key, daphne, ensure_database, percentile
from bench_sandbox_api import BWRAP

IMAGE = os.environ.get("SANDPIT_DOCKER_IMAGE", "sandpit-sandbox:latest")
NODE = {"command": "node", "args": ["-v"]}
# ComputeSDK's public benchmark (hosted services over the internet, 100 sandboxes at once,
# then `node -v`): burst medians. Context only; not measured here.
HOSTED_BURST_MEDIANS_MS = {"Daytona": 367, "E2B": 822, "Vercel": 832}


async def floor_once(provider: str) -> float:
    argv = (
        [*BWRAP, "node", "-v"]
        if provider == "local"
        else ["docker", "run", "--rm", "--network", "none", IMAGE, "node", "-v"]
    )
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    if proc.returncode != 0 or not out.startswith(b"v"):
        raise RuntimeError(f"floor failed: {err.decode(errors='replace')[-300:]}")
    return (time.perf_counter() - started) * 1000


async def product_once(client: httpx.AsyncClient, provider: str, created: list[str]) -> float:
    """Create -> first `node -v` answered (destroy is not timed)."""
    started = time.perf_counter()
    response = await client.post("/api/v1/sandboxes", json={"provider": provider})
    if response.status_code != 201:
        raise RuntimeError(f"create: {response.status_code} {response.text[:300]}")
    sandbox_id = response.json()["id"]
    created.append(sandbox_id)
    response = await client.post(f"/api/v1/sandboxes/{sandbox_id}/commands", json=NODE)
    if response.status_code != 200 or not response.json()["stdout"].startswith("v"):
        raise RuntimeError(f"command: {response.status_code} {response.text[:300]}")
    return (time.perf_counter() - started) * 1000


async def destroy_all(client: httpx.AsyncClient, created: list[str]) -> None:
    for start in range(0, len(created), 20):
        batch = created[start : start + 20]
        await asyncio.gather(*(client.delete(f"/api/v1/sandboxes/{sid}") for sid in batch))
    created.clear()


def summary(samples: list[float]) -> tuple[float, float]:
    return statistics.median(samples), percentile(samples, 95)


def _warm_ready(root: Path) -> int:
    return sum(1 for d in root.glob("warm-*") if (d / "state.json").exists())


async def wait_warm(root: Path | None, want: int) -> None:
    """Until `want` warm jails are ready under `root` (each has written its state), or 120 s."""
    if root is None or want <= 0:
        return
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if await asyncio.to_thread(_warm_ready, root) >= want:
            await asyncio.sleep(0.5)  # the last one's agent answers shortly after
            return
        await asyncio.sleep(0.2)
    print(f"warning: warm pools not full after 120 s (wanted {want})")


async def measure(
    port: int, key: str, args: argparse.Namespace, root: Path | None = None
) -> list[tuple[str, ...]]:
    want = (args.warm_pool or 0) * args.processes
    rows: list[tuple[str, ...]] = []
    limits = httpx.Limits(max_connections=args.burst + 10, max_keepalive_connections=args.burst)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}",
        headers={"Authorization": f"Bearer {key}"},
        timeout=300,
        limits=limits,
    ) as client:
        created: list[str] = []
        # Warm-up (imports, connection pools, the provider's first jail or container).
        for _ in range(3):
            await product_once(client, args.provider, created)
            await floor_once(args.provider)
        await destroy_all(client, created)

        # One after another, product and floor interleaved.
        await wait_warm(root, want)
        product: list[float] = []
        floor: list[float] = []
        for _ in range(args.sequential):
            product.append(await product_once(client, args.provider, created))
            floor.append(await floor_once(args.provider))
        await destroy_all(client, created)
        rows.append(("one after another", *_row(product, floor)))

        # Many at once: the floor burst, then the product burst.
        await wait_warm(root, want)
        floor = list(await asyncio.gather(*(floor_once(args.provider) for _ in range(args.burst))))
        results = await asyncio.gather(
            *(product_once(client, args.provider, created) for _ in range(args.burst)),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        product = [r for r in results if isinstance(r, float)]
        await destroy_all(client, created)
        rows.append((f"{args.burst} at once ({len(errors)} errors)", *_row(product, floor)))
        for error in errors[:3]:
            print("error:", error)
    return rows


def _row(product: list[float], floor: list[float]) -> tuple[str, ...]:
    if not product:
        return ("-", "-", f"{summary(floor)[0]:.0f}", f"{summary(floor)[1]:.0f}", "-")
    p50, p95 = summary(product)
    f50, f95 = summary(floor)
    return (f"{p50:.0f}", f"{p95:.0f}", f"{f50:.0f}", f"{f95:.0f}", f"{p50 / f50:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--provider", choices=["local", "docker"], default="local")
    parser.add_argument("--sequential", type=int, default=20)
    parser.add_argument("--burst", type=int, default=100)
    parser.add_argument("--warm-pool", type=int, default=None)
    parser.add_argument("--processes", type=int, default=1)
    args = parser.parse_args()
    extra = {
        "SANDPIT_PROVIDERS": "local,docker" if args.provider == "docker" else "local",
        "SANDPIT_DOCKER_IMAGE": IMAGE,
        "SANDPIT_MAX_CONCURRENT_SANDBOXES": str(max(200, args.burst * 2)),
    }
    root = None
    if args.warm_pool is not None:
        # A jail root of its own, passable by jail uids, to see when the pools are full.
        base = Path(tempfile.gettempdir()) / "sandpit-bench-jails"
        base.mkdir(exist_ok=True)
        os.chmod(base, 0o711)  # noqa: S103
        root = Path(tempfile.mkdtemp(prefix="burst-", dir=base))
        os.chmod(root, 0o711)  # noqa: S103
        extra |= {"SANDPIT_LOCAL_WARM_POOL": str(args.warm_pool), "SANDPIT_LOCAL_ROOT": str(root)}
    env = bench_env(extra)
    ensure_database(env)
    key = create_org_and_key(env, slug="bench-burst")
    with daphne(env, processes=args.processes) as port:
        rows = asyncio.run(measure(port, key, args, root))
    floor_name = "bwrap node -v" if args.provider == "local" else "docker run --rm node -v"
    pool = "server default" if args.warm_pool is None else str(args.warm_pool)
    print(
        f"\n{args.provider}: create -> first `node -v` (ms), floor = raw `{floor_name}`; "
        f"warm pool {pool} per process, {args.processes} web process(es)"
    )
    header = ("measure", "p50", "p95", "floor p50", "floor p95", "p50 ratio")
    print(" | ".join(header))
    for row in rows:
        print(" | ".join(row))
    hosted = ", ".join(f"{name} {ms} ms" for name, ms in HOSTED_BURST_MEDIANS_MS.items())
    print(f"\nFor context only (published, hosted, over the internet): burst medians {hosted}")


if __name__ == "__main__":
    main()
