"""Docker provider latency against the raw engine floors.

    .venv/bin/python bench/bench_docker_provider.py [runs]

Prints p50/p95 in ms for: raw `docker run --rm IMAGE python3 -c pass` (CLI),
DockerProvider create + first exec of the same command, a raw SDK exec into a
running container, the provider's exec, and destroy.
"""

from __future__ import annotations

import functools
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandboxes.providers.base import ExecRequest, SandboxSpec
from sandboxes.providers.docker import DockerProvider

IMAGE = "sandpit-sandbox:latest"
CMD = ["python3", "-c", "pass"]


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000.0


def report(name: str, samples: list[float]) -> None:
    s = sorted(samples)
    p95 = s[min(len(s) - 1, round(0.95 * (len(s) - 1)))]
    print(f"{name:<40} p50 {statistics.median(s):7.1f} ms   p95 {p95:7.1f} ms   (n={len(s)})")


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    provider = DockerProvider(image=IMAGE, installation="bench")
    subprocess.run(["docker", "run", "--rm", IMAGE, "true"], check=True)  # warm caches
    samples: dict[str, list[float]] = defaultdict(list)

    # Pairs are interleaved so both sides see the same machine load.
    ids: list[str] = []

    def create_and_exec() -> None:
        handle = provider.create(SandboxSpec(sandbox_id=f"bench-{len(ids)}"))
        ids.append(handle.provider_id)
        result = provider.exec(handle.provider_id, ExecRequest(command=CMD[0], args=CMD[1:]))
        assert result.exit_code == 0, result

    for _ in range(runs):
        samples["docker run --rm IMAGE python3 -c pass"].append(
            timed(lambda: subprocess.run(["docker", "run", "--rm", IMAGE, *CMD], check=True))
        )
        samples["provider create + first exec (same)"].append(timed(create_and_exec))
    for provider_id in ids:
        samples["provider destroy"].append(timed(functools.partial(provider.destroy, provider_id)))

    handle = provider.create(SandboxSpec(sandbox_id="bench-exec"))
    # The provider's own docker-py APIClient, used raw: exec_create + exec_start +
    # exec_inspect is what Container.exec_run does (bench code may reach inside).
    api = provider._api()

    def sdk_exec(cmd: list[str]) -> None:
        exec_id = api.exec_create(handle.provider_id, cmd)["Id"]
        api.exec_start(exec_id)
        assert api.exec_inspect(exec_id)["ExitCode"] == 0

    def provider_exec(cmd: list[str]) -> None:
        result = provider.exec(handle.provider_id, ExecRequest(command=cmd[0], args=cmd[1:]))
        assert result.exit_code == 0, result

    for _ in range(runs):
        samples["raw SDK exec python3 -c pass"].append(timed(lambda: sdk_exec(CMD)))
        samples["provider exec python3 -c pass"].append(timed(lambda: provider_exec(CMD)))
        samples["raw SDK exec true"].append(timed(lambda: sdk_exec(["true"])))
        samples["provider exec true"].append(timed(lambda: provider_exec(["true"])))
        samples["provider write_file 1 KiB"].append(
            timed(lambda: provider.write_file(handle.provider_id, "b.txt", b"x" * 1024))
        )
        samples["provider read_file 1 KiB"].append(
            timed(lambda: provider.read_file(handle.provider_id, "b.txt"))
        )
    provider.destroy(handle.provider_id)
    for name, values in samples.items():
        report(name, values)


if __name__ == "__main__":
    main()
