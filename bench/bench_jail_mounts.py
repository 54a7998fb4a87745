"""What the host's own mounts cost a cold jail's start, with jail_launch keeping only the
mounts bwrap reads (the product) and keeping every mount outside the jail root (as before).

Usage: .venv/bin/python bench/bench_jail_mounts.py [--runs 60] [--extra 0,100]

As root. For each count in --extra, that many tmpfs mounts are made on the host outside the
jail root (what a container engine's or other disks' mounts look like to bwrap), then cold
sandboxes (create, first `node -v`, destroy; no warm pool) alternate between the two ways in
blocks of 10, in one process. Prints the p50 of create + first command, and the whole
machine's CPU per sandbox (from /proc/stat, so run it on an otherwise idle machine).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_local_provider import machine_busy_ms  # noqa: E402

from sandboxes.providers.base import ExecRequest, SandboxSpec  # noqa: E402
from sandboxes.providers.local import LocalProvider, launcher  # noqa: E402

NODE = ExecRequest(command="node", args=["-v"])
WAYS = ("only what bwrap reads (now)", "every mount outside the root (before)")


@contextmanager
def host_mounts(count: int) -> Iterator[None]:
    """`count` small tmpfs mounts on the host, outside any jail root."""
    base = Path(tempfile.mkdtemp(prefix="bench-host-mounts-"))
    made = []
    try:
        for index in range(count):
            point = base / str(index)
            point.mkdir()
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "t", point], check=True)
            made.append(point)
        yield
    finally:
        for point in reversed(made):
            subprocess.run(["umount", "-l", point], check=False)
        subprocess.run(["rm", "-rf", base], check=False)


def cold_sandbox(provider: LocalProvider) -> float:
    """Create -> first `node -v` answered, ms; then destroyed."""
    started = time.perf_counter()
    sid = provider.create(SandboxSpec(sandbox_id=uuid.uuid4().hex)).provider_id
    result = provider.exec(sid, NODE)
    elapsed = (time.perf_counter() - started) * 1000
    if result.exit_code != 0:
        raise RuntimeError(result.stderr.decode(errors="replace"))
    provider.destroy(sid)
    return elapsed


def measure(provider: LocalProvider, runs: int) -> dict[str, tuple[list[float], float]]:
    needs = launcher.needs
    samples: dict[str, list[float]] = {way: [] for way in WAYS}
    busy: dict[str, float] = dict.fromkeys(WAYS, 0.0)
    for block in range(runs // 10):
        for way in WAYS if block % 2 == 0 else reversed(WAYS):
            # The way before: NEEDS "/" keeps every mount outside the root.
            launcher.needs = needs if way == WAYS[0] else (lambda *_: launcher.KEEP_EVERY_MOUNT)
            try:
                before = machine_busy_ms()
                samples[way] += [cold_sandbox(provider) for _ in range(10)]
                busy[way] += machine_busy_ms() - before
            finally:
                launcher.needs = needs
    return {way: (samples[way], busy[way] / len(samples[way])) for way in WAYS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--extra", default="0,100")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (jail_launch and the host mounts)")
    provider = LocalProvider(root_dir=Path(tempfile.mkdtemp(prefix="bench-jail-mounts-")))
    for _ in range(5):
        cold_sandbox(provider)  # warm the page cache and the helper's build
    print("cold sandbox: create -> first `node -v` (then destroyed), alternated in blocks of 10")
    print("host mounts | jail_launch keeps | p50 ms | machine CPU ms per sandbox")
    for extra in (int(n) for n in args.extra.split(",")):
        with host_mounts(extra):
            total = len(Path("/proc/self/mountinfo").read_text().splitlines())
            for way, (samples, cpu) in measure(provider, args.runs).items():
                print(f"{total} | {way} | {statistics.median(samples):.1f} | {cpu:.1f}")
    provider.close()


if __name__ == "__main__":
    main()
