"""Raw LocalProvider latency against bare bubblewrap on this machine.

Usage: [BENCH_LIVE=100] .venv/bin/python bench/bench_local_provider.py [runs]
Prints p50/p95 in ms for: bwrap spawning `python3 -c pass` with the jail's own
flags; create + first exec of the same command, cold and from a warm pool of 2
(given time to refill between creates, so every create claims a warm jail);
exec round trips; destroy. Also the whole machine's CPU per raw spawn and per cold
sandbox (create, first exec, destroy): what a burst of cold sandboxes is bound by on a
machine with few cores (read from /proc/stat, so run it on an otherwise idle machine).
Last, cold starts again with BENCH_LIVE other sandboxes live, through jail_launch and through
setpriv alternated, beside the raw spawn then (each live sandbox is a mount on the host).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandboxes.providers.base import ExecRequest, SandboxSpec  # noqa: E402
from sandboxes.providers.local import (
    LocalProvider,  # noqa: E402
    jail,  # noqa: E402
)

PASS = ExecRequest(command="python3", args=["-c", "pass"])
TRUE = ExecRequest(command="true", args=[])


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(name: str, samples: list[float]) -> None:
    print(
        f"{name:<38} p50 {pct(samples, 0.5):7.2f} ms   p95 {pct(samples, 0.95):7.2f} ms"
        f"   mean {statistics.mean(samples):7.2f}"
    )


def machine_busy_ms() -> float:
    """CPU time the whole machine has spent busy since boot (all cores), in ms."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    idle = ticks[3] + ticks[4]  # idle and iowait
    return (sum(ticks) - idle) * 1000 / os.sysconf("SC_CLK_TCK")


def raw_bwrap_argv(root: Path) -> list[str]:
    """The jail's own bwrap flags, running `python3 -c pass` instead of the agent."""
    sdir = root / "raw"
    for sub in ("workspace", "tmp", "run"):
        (sdir / sub).mkdir(parents=True, exist_ok=True)
    etc = root / ".sandpit" / "etc"
    jail.write_shared_etc(etc)
    agent = root / "agent.pyz"  # bound in as in a jail; the raw spawn does not run it
    agent.touch()
    r, w = os.pipe()
    argv = jail.bwrap_argv(
        bwrap="bwrap",
        sandbox_dir=sdir,
        shared_etc=etc,
        agent_path=agent,
        network=False,
        env=jail.base_env({}),
        info_fd=w,
        block_fd=r,
        agent_config={},
    )
    os.close(r)
    os.close(w)
    cut = argv.index("--info-fd")
    return argv[:cut] + ["/usr/bin/python3", "-c", "pass"]


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    root = Path(tempfile.mkdtemp(prefix="sandpit-bench-"))
    root.chmod(0o711)  # the jails' unprivileged uids pass through to their own directories
    provider = LocalProvider(root / "sandboxes")

    argv = raw_bwrap_argv(root / "sandboxes")
    raw = []
    busy = machine_busy_ms()
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(argv, check=True)
        raw.append((time.perf_counter() - t) * 1000)
    raw_cpu = (machine_busy_ms() - busy) / runs

    create, first, create_first, destroy = [], [], [], []
    busy = machine_busy_ms()
    for _ in range(runs):  # cold: warm_pool=0
        t0 = time.perf_counter()
        sid = provider.create(SandboxSpec(sandbox_id=uuid.uuid4().hex)).provider_id
        t1 = time.perf_counter()
        assert provider.exec(sid, PASS).exit_code == 0
        t2 = time.perf_counter()
        provider.destroy(sid)
        t3 = time.perf_counter()
        create.append((t1 - t0) * 1000)
        first.append((t2 - t1) * 1000)
        create_first.append((t2 - t0) * 1000)
        destroy.append((t3 - t2) * 1000)
    cold_cpu = (machine_busy_ms() - busy) / runs

    warm = LocalProvider(root / "sandboxes", warm_pool=2)
    assert warm._pool is not None
    warm_create, warm_create_first, warm_destroy = [], [], []
    try:
        for _ in range(runs):
            assert warm._pool.wait_full(30), "the warm pool did not fill"
            t0 = time.perf_counter()
            sid = warm.create(SandboxSpec(sandbox_id=uuid.uuid4().hex)).provider_id
            t1 = time.perf_counter()
            assert warm.exec(sid, PASS).exit_code == 0
            t2 = time.perf_counter()
            warm.destroy(sid)
            t3 = time.perf_counter()
            warm_create.append((t1 - t0) * 1000)
            warm_create_first.append((t2 - t0) * 1000)
            warm_destroy.append((t3 - t2) * 1000)
    finally:
        warm.close()

    sid = provider.create(SandboxSpec(sandbox_id=uuid.uuid4().hex)).provider_id
    rt_pass, rt_true, rt_write = [], [], []
    for _ in range(runs):
        t = time.perf_counter()
        provider.exec(sid, PASS)
        rt_pass.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        provider.exec(sid, TRUE)
        rt_true.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        provider.write_file(sid, "bench.txt", b"x" * 1024)
        rt_write.append((time.perf_counter() - t) * 1000)
    provider.destroy(sid)

    crowded = crowded_starts(root, runs)

    print(f"runs: {runs}")
    report("raw bwrap `python3 -c pass`", raw)
    report("create()", create)
    report("first exec `python3 -c pass`", first)
    report("create + first exec", create_first)
    report("create() warm pool", warm_create)
    report("create + first exec, warm pool", warm_create_first)
    report("exec round trip `python3 -c pass`", rt_pass)
    report("exec round trip `true`", rt_true)
    report("write_file 1 KiB", rt_write)
    report("destroy()", destroy)
    report("destroy() warm-claimed", warm_destroy)
    print(f"{'CPU per raw spawn (machine)':<38} {raw_cpu:7.2f} ms")
    print(
        f"{'CPU per cold sandbox (machine)':<38} {cold_cpu:7.2f} ms   (create, first exec, destroy)"
    )
    target = 2 * pct(raw, 0.5) + 10
    print(f"target create+first p50 <= 2*raw+10 = {target:.2f} ms")
    print(
        f"\ncold create + first exec + destroy with {LIVE} other sandboxes live, p50 ms "
        "(CPU per sandbox, machine); the raw floor beside it"
    )
    for label, (times, cpu) in crowded.items():
        print(f"{label:<52} p50 {pct(times, 0.5):7.2f} ms   CPU {cpu:6.2f} ms")


LIVE = int(os.environ.get("BENCH_LIVE", "100"))
"""Other sandboxes live while `crowded_starts` measures (each holds a tmpfs mount on the
host); BENCH_LIVE sets it."""


def crowded_starts(root: Path, runs: int) -> dict[str, tuple[list[float], float]]:
    """Cold starts with LIVE other sandboxes live, through jail_launch (launcher.py) and
    through setpriv beside every volume, alternated run by run, and the raw floor then."""
    apart = LocalProvider(root / "crowded")
    beside = LocalProvider(root / "crowded", launch_apart=False)
    live = [apart.create(SandboxSpec(sandbox_id=uuid.uuid4().hex)).provider_id for _ in range(LIVE)]
    argv = raw_bwrap_argv(root / "crowded")
    results: dict[str, tuple[list[float], float]] = {}
    try:
        samples: dict[str, list[float]] = {"apart": [], "beside": [], "raw": []}
        cpu = dict.fromkeys(samples, 0.0)
        for _ in range(runs):
            for label, provider in (("apart", apart), ("beside", beside)):
                busy = machine_busy_ms()
                t0 = time.perf_counter()
                sid = provider.create(SandboxSpec(sandbox_id=uuid.uuid4().hex)).provider_id
                assert provider.exec(sid, PASS).exit_code == 0
                samples[label].append((time.perf_counter() - t0) * 1000)
                provider.destroy(sid)
                cpu[label] += machine_busy_ms() - busy
            busy = machine_busy_ms()
            t0 = time.perf_counter()
            subprocess.run(argv, check=True)
            samples["raw"].append((time.perf_counter() - t0) * 1000)
            cpu["raw"] += machine_busy_ms() - busy
        names = {
            "apart": "create + first exec, jail_launch (this product)",
            "beside": "create + first exec, through setpriv (before)",
            "raw": "raw bwrap `python3 -c pass` (floor)",
        }
        for label, times in samples.items():
            results[names[label]] = (times, cpu[label] / runs)
    finally:
        for sid in live:
            apart.destroy(sid)
    return results


if __name__ == "__main__":
    main()
