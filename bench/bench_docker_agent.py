"""Docker command round trips through the in-sandbox agent, beside local's and the floors.

    .venv/bin/python bench/bench_docker_agent.py [runs] [provider module]

Same run, same command (`true` for round trips, `python3 -c pass` for create + first):
the local provider's exec, the docker provider's exec, a raw `docker exec` (CLI) and
`docker run --rm`, a bare bwrap spawn; and docker create + first command. `provider
module` picks the Docker provider implementation (default sandboxes.providers.docker).
"""

from __future__ import annotations

import importlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandboxes.providers.base import ExecRequest, SandboxSpec
from sandboxes.providers.local import LocalProvider

IMAGE = sys.argv[3] if len(sys.argv) > 3 else "sandpit-sandbox:latest"


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000.0


def p50(samples: list[float]) -> float:
    return statistics.median(samples)


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    module = sys.argv[2] if len(sys.argv) > 2 else "sandboxes.providers.docker"
    docker_cls = importlib.import_module(module).DockerProvider
    root = tempfile.mkdtemp(prefix="bench-local-")
    local = LocalProvider(root_dir=root)
    dock = docker_cls(installation="bench", image=IMAGE)
    true = ExecRequest(command="true", args=[])
    lsb = local.create(SandboxSpec(sandbox_id=uuid.uuid4().hex)).provider_id
    dsb = dock.create(SandboxSpec(sandbox_id=uuid.uuid4().hex)).provider_id
    results: dict[str, list[float]] = {}
    bwrap_true = [shutil.which("bwrap") or "bwrap", "--ro-bind", "/", "/", "--unshare-all", "true"]
    created: list[str] = []

    def create_first() -> None:
        sid = dock.create(SandboxSpec(sandbox_id=uuid.uuid4().hex)).provider_id
        created.append(sid)
        dock.exec(sid, ExecRequest(command="python3", args=["-c", "pass"]))

    try:
        dock.exec(dsb, true)
        for _ in range(runs):
            results.setdefault("local exec `true`", []).append(timed(lambda: local.exec(lsb, true)))
            results.setdefault("docker exec `true` (provider)", []).append(
                timed(lambda: dock.exec(dsb, true))
            )
            results.setdefault("floor: docker exec CLI `true`", []).append(
                timed(lambda: subprocess.run(["docker", "exec", dsb, "true"], check=True))
            )
            results.setdefault("floor: bwrap spawn `true`", []).append(
                timed(lambda: subprocess.run(bwrap_true, check=True))
            )
        for _ in range(max(3, runs // 5)):
            results.setdefault("floor: docker run --rm python3 -c pass", []).append(
                timed(
                    lambda: subprocess.run(
                        ["docker", "run", "--rm", IMAGE, "python3", "-c", "pass"], check=True
                    )
                )
            )
            results.setdefault("docker create + first python3 -c pass", []).append(
                timed(create_first)
            )
            while created:
                dock.destroy(created.pop())
    finally:
        local.destroy(lsb)
        dock.destroy(dsb)
        local.close()
        shutil.rmtree(root, ignore_errors=True)
    for name, samples in results.items():
        print(f"{name:<42} p50 {p50(samples):7.1f} ms   (n={len(samples)})")
    ratio = p50(results["docker exec `true` (provider)"]) / p50(results["local exec `true`"])
    create = p50(results["docker create + first python3 -c pass"]) / p50(
        results["floor: docker run --rm python3 -c pass"]
    )
    print(f"docker/local round trip: {ratio:.2f}x   create+first / run --rm: {create:.2f}x")


if __name__ == "__main__":
    main()
