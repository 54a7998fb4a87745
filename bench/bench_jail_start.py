"""A cold jail's start in CPU, part by part, beside a fork of a started agent.

What a burst of cold creates pays per jail, measured from the outside in the same run,
alternated: a raw `bwrap true` (the floor's namespaces and binds), the same bwrap running
the jails' interpreter (`python3 -I -S -c pass`), and running it to the agent's import
from the bundle the local provider installs (compiled, as jails run it). Beside them, the
estimates for a jail that would not start its own interpreter, from a process that has
already imported the agent (a zygote; bench/_fork_jail_probe.py): forked into namespaces
it makes itself (a lower bound), and forked by setns into a jail bwrap made around a
placeholder (bwrap's set-up kept). Neither is a whole jail: no uid change, no cgroups.

CPU is the cgroup's (cpuacct): every process of a start and the kernel's work done on their
behalf, which the wait status's rusage misses for bwrap's namespaced children. Root only
(cgroups, unshare).

Run: .venv/bin/python bench/bench_jail_start.py [--runs 40]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _server import ROOT, percentile
from bench_burst import _CPUACCT, _own_cgroup
from bench_sandbox_api import BWRAP

sys.path.insert(0, str(ROOT))
from sandboxes.providers import agent_bundle  # noqa: E402

PYTHON = "/usr/bin/python3"
JAIL_AGENT = "/opt/sandpit/agent.pyz"
PROBE = Path(__file__).resolve().parent / "_fork_jail_probe.py"
ZYGOTE_WAYS = {
    "unshare": "a started agent forked into namespaces it makes itself, with its own /proc "
    "and a tmpfs (a lower bound: no root of its own, uid or cgroups)",
    "setns": "bwrap around a placeholder (sh, then sleep), a started agent forked into its "
    "namespaces by setns (bwrap's set-up kept; no uid change or cgroups)",
}


def probe_argv(bundle: Path, count: int, mount_point: Path, how: str) -> list[str]:
    """_fork_jail_probe.py under the jails' interpreter; `setns` with the floor's bwrap."""
    return [
        PYTHON,
        "-I",
        "-S",
        str(PROBE),
        str(bundle),
        str(count),
        str(mount_point),
        how,
        *(BWRAP if how == "setns" else []),
    ]


class Meter:
    """CPU seconds of a cgroup this process moves into (its children join it)."""

    def __init__(self) -> None:
        own = _own_cgroup("cpuacct")
        if os.geteuid() != 0 or own is None:
            raise SystemExit("run as root on a host with the cpuacct controller (cgroup v1)")
        self.home = Path(f"{_CPUACCT}{own.rstrip('/')}")
        self.path = self.home / f"bench-jail-start-{os.getpid()}"
        self.path.mkdir()
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def cpu_ms(self) -> float:
        return int((self.path / "cpuacct.usage").read_text()) / 1e6

    def close(self) -> None:
        (self.home / "cgroup.procs").write_text(str(os.getpid()))
        self.path.rmdir()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    meter = Meter()  # before anything to remove: it refuses when not root
    work = Path(tempfile.mkdtemp(prefix="bench-jail-start-"))
    bundle = work / "agent.pyz"
    agent_bundle.install(bundle, python=PYTHON)
    jail = [*BWRAP, "--ro-bind", str(bundle), JAIL_AGENT]
    import_agent = (
        f"import sys; sys.path.insert(0, {JAIL_AGENT!r}); from sandpit_agent import server"
    )
    mount_point = work / "mnt"
    mount_point.mkdir()

    def run(argv: list[str]) -> Callable[[], None]:
        return lambda: subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)

    parts: dict[str, Callable[[], None]] = {
        "bwrap true (the floor's namespaces and binds)": run([*BWRAP, "true"]),
        "bwrap + python3 -I -S -c pass": run([*jail, PYTHON, "-I", "-S", "-c", "pass"]),
        "bwrap + python3 -I -S + the agent's import": run(
            [*jail, PYTHON, "-I", "-S", "-c", import_agent]
        ),
    }
    try:
        cpu: dict[str, list[float]] = {name: [] for name in parts}
        wall: dict[str, list[float]] = {name: [] for name in parts}
        for _ in range(args.runs):  # alternated: the machine's noise falls on all alike
            for name, start in parts.items():
                before, started = meter.cpu_ms(), time.perf_counter()
                start()
                wall[name].append((time.perf_counter() - started) * 1000)
                cpu[name].append(meter.cpu_ms() - before)
        # The forks run in one process that imported the agent once, as a zygote would;
        # its own start and import are paid once, not per jail: taken off.
        forked: dict[str, tuple[float, list[float]]] = {}
        for how in ZYGOTE_WAYS:
            before = meter.cpu_ms()
            probe = subprocess.run(
                probe_argv(bundle, args.runs, mount_point, how),
                check=True,
                capture_output=True,
                text=True,
            )
            walls = [float(line) for line in probe.stdout.split()]
            once_before = meter.cpu_ms()
            subprocess.run(probe_argv(bundle, 0, mount_point, how), check=True)
            once = meter.cpu_ms() - once_before
            forked[how] = ((once_before - before - once) / max(1, len(walls)), walls)
    finally:
        meter.close()
        shutil.rmtree(work, ignore_errors=True)
    print(f"A cold jail's start, part by part ({args.runs} each, alternated); CPU by cgroup")
    print("part | CPU-ms p50 | wall ms p50 | wall ms p95")
    for name in parts:
        print(
            f"{name} | {statistics.median(cpu[name]):.2f} | "
            f"{statistics.median(wall[name]):.2f} | {percentile(wall[name], 95):.2f}"
        )
    for how, (per_jail, walls) in forked.items():
        print(
            f"{ZYGOTE_WAYS[how]} | {per_jail:.2f} (mean) | "
            f"{statistics.median(walls):.2f} | {percentile(walls, 95):.2f}"
        )


if __name__ == "__main__":
    main()
