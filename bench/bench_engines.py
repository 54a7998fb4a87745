"""What placement over several Docker engines costs, beside the floors, in one run.

    .venv/bin/python bench/bench_engines.py [runs]

Needs the second engine of the tests (scripts/docker-engine.sh start pytest-b IMAGE; this
script starts it and stops it again if it was not running). Prints p50/p95 in ms, runs
interleaved so every line sees the same machine load:

* `docker run --rm IMAGE true` (the CLI floor for a container);
* create + first exec + destroy on one engine (DockerProvider alone, no placement);
* the same through DockerEngines over two engines (placement: a ping and a list per engine,
  then the create on the chosen one);
* the placement's own reading of both engines (engine_statuses: what each create adds).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sandboxes.providers.base import ExecRequest, Resources, SandboxSpec  # noqa: E402
from sandboxes.providers.docker import DockerProvider  # noqa: E402
from sandboxes.providers.docker.engines import DockerEngines, parse_engines  # noqa: E402

IMAGE = os.environ.get("SANDPIT_DOCKER_IMAGE", "sandpit-sandbox:latest")
ENGINE = "pytest-b"
SCRIPT = ROOT / "scripts" / "docker-engine.sh"


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000.0


def report(name: str, samples: list[float]) -> None:
    s = sorted(samples)
    p95 = s[min(len(s) - 1, round(0.95 * (len(s) - 1)))]
    print(f"{name:<58} p50 {statistics.median(s):7.1f} ms   p95 {p95:7.1f} ms   (n={len(s)})")


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    was_running = (
        subprocess.run(
            ["docker", "-H", f"unix:///run/sandpit-engine-{ENGINE}/docker.sock", "version"],
            capture_output=True,
        ).returncode
        == 0
    )
    url = subprocess.run(
        [str(SCRIPT), "start", ENGINE, IMAGE], capture_output=True, text=True, check=True
    ).stdout.strip()
    installation = f"bench-engines-{uuid.uuid4().hex[:6]}"
    single = DockerProvider(image=IMAGE, installation=installation)
    fleet = DockerEngines(
        parse_engines(f"unix:///var/run/docker.sock#name=a,{url}#name=b", ""),
        image=IMAGE,
        installation=installation,
    )
    small = Resources(memory_mb=64)

    def lifecycle(provider: DockerProvider | DockerEngines) -> None:
        handle = provider.create(SandboxSpec(sandbox_id=uuid.uuid4().hex, resources=small))
        assert provider.exec(handle.provider_id, ExecRequest(command="true")).exit_code == 0
        provider.destroy(handle.provider_id)

    samples: dict[str, list[float]] = defaultdict(list)
    subprocess.run(["docker", "run", "--rm", IMAGE, "true"], check=True)  # warm caches
    lifecycle(single)
    lifecycle(fleet)
    try:
        for _ in range(runs):
            samples["docker run --rm IMAGE true (floor)"].append(
                timed(lambda: subprocess.run(["docker", "run", "--rm", IMAGE, "true"], check=True))
            )
            samples["one engine: create + exec + destroy"].append(timed(lambda: lifecycle(single)))
            samples["two engines (placement): create + exec + destroy"].append(
                timed(lambda: lifecycle(fleet))
            )
            samples["placement's reading of both engines"].append(timed(fleet.engine_statuses))
    finally:
        fleet.close()
        if not was_running:
            subprocess.run([str(SCRIPT), "stop", ENGINE], check=False)
    for name, values in samples.items():
        report(name, values)


if __name__ == "__main__":
    main()
