"""Docker sandboxes under runc and under gVisor (runsc), beside the raw floors, same run.

    .venv/bin/python bench/bench_runtimes.py [runs]

Per runtime: create -> first command (`python3 -c pass`), a command round trip (`true`),
a terminal echo (one byte through the PTY and back), and the floors `docker run --rm`
and `docker exec` (CLI) with that runtime. Needs runsc registered (scripts/docker-up.sh).
Medians in milliseconds.
"""

from __future__ import annotations

import select
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandboxes.providers.base import ExecRequest, SandboxSpec
from sandboxes.providers.docker import DockerProvider

IMAGE = "sandpit-sandbox:latest"
RUNS = int(sys.argv[1]) if len(sys.argv) > 1 else 10


def median_ms(fn: Callable[[], None], runs: int) -> float:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1000.0)
    return statistics.median(samples)


def measure(runtime: str) -> dict[str, float]:
    provider = DockerProvider(image=IMAGE, installation="bench", runtime=runtime)
    made: list[str] = []
    out: dict[str, float] = {}

    def create_first() -> None:
        handle = provider.create(SandboxSpec(sandbox_id=uuid.uuid4().hex))
        made.append(handle.provider_id)
        assert (
            provider.exec(handle.provider_id, ExecRequest(command="python3 -c pass")).exit_code == 0
        )

    try:
        out["create + first command"] = median_ms(create_first, max(3, RUNS // 2))
        sandbox = made[0]
        true = ExecRequest(command="true", args=[])
        out["command round trip"] = median_ms(lambda: provider.exec(sandbox, true), RUNS * 2)
        pty = provider.open_pty(sandbox)
        try:
            pty.write(b"stty raw -echo; cat\r")
            deadline = time.monotonic() + 15

            def drain(until: bytes) -> None:
                seen = b""
                while until not in seen:
                    assert time.monotonic() < deadline, seen
                    select.select([pty.fileno()], [], [], 1.0)
                    try:
                        seen += pty.read()
                    except BlockingIOError:
                        continue

            pty.write(b"ready\r")
            drain(b"ready")

            def echo() -> None:
                pty.write(b"x")
                drain(b"x")

            out["terminal echo"] = median_ms(echo, RUNS * 5)
        finally:
            pty.close()
        cid = made[0]
        out["floor: docker exec (CLI)"] = median_ms(
            lambda: subprocess.run(["docker", "exec", cid, "true"], check=True), RUNS
        )
        out["floor: docker run --rm"] = median_ms(
            lambda: subprocess.run(
                ["docker", "run", "--rm", f"--runtime={runtime}", "--network=none", IMAGE, "true"],
                check=True,
            ),
            max(3, RUNS // 2),
        )
    finally:
        for provider_id in made:
            provider.destroy(provider_id)
    return out


def main() -> None:
    results = {runtime: measure(runtime) for runtime in ("runc", "runsc")}
    rows = list(results["runc"])
    print(f"{'median ms':<28}{'runc':>10}{'runsc':>10}{'ratio':>8}")
    for row in rows:
        runc, runsc = results["runc"][row], results["runsc"][row]
        print(f"{row:<28}{runc:>10.2f}{runsc:>10.2f}{runsc / runc:>7.1f}x")


if __name__ == "__main__":
    main()
