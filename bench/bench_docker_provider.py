"""Docker provider latency against the raw engine floors.

    .venv/bin/python bench/bench_docker_provider.py [runs]

Prints p50/p95 in ms for: raw `docker run --rm IMAGE python3 -c pass` (CLI),
DockerProvider create + first exec of the same command, a raw SDK exec into a
running container, the provider's exec, and destroy.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandboxes.providers.base import ExecRequest, SandboxSpec
from sandboxes.providers.docker import DockerProvider

IMAGE = "sandpit-sandbox:latest"
CMD = ["python3", "-c", "pass"]


def timed(fn, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000.0)
    return out


def report(name: str, samples: list[float]) -> None:
    s = sorted(samples)
    p95 = s[min(len(s) - 1, round(0.95 * (len(s) - 1)))]
    print(f"{name:<44} p50 {statistics.median(s):7.1f} ms   p95 {p95:7.1f} ms   (n={len(s)})")


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    provider = DockerProvider(image=IMAGE, installation="bench")
    subprocess.run(["docker", "run", "--rm", IMAGE, "true"], check=True)  # warm caches

    report(
        "docker run --rm IMAGE python3 -c pass",
        timed(lambda: subprocess.run(["docker", "run", "--rm", IMAGE, *CMD], check=True), runs),
    )

    ids: list[str] = []

    def create_and_exec() -> None:
        handle = provider.create(SandboxSpec(sandbox_id=f"bench-{len(ids)}"))
        ids.append(handle.provider_id)
        result = provider.exec(handle.provider_id, ExecRequest(command=CMD[0], args=CMD[1:]))
        assert result.exit_code == 0, result

    report("provider create + first exec", timed(create_and_exec, runs))
    destroy = timed(lambda: provider.destroy(ids.pop()), len(ids))

    handle = provider.create(SandboxSpec(sandbox_id="bench-exec"))
    # The provider's own docker-py APIClient, used raw: exec_create + exec_start + exec_inspect
    # is what docker-py's Container.exec_run does (bench code may reach inside; nothing else may).
    api = provider._api()

    def sdk_exec(cmd: list[str]) -> None:
        exec_id = api.exec_create(handle.provider_id, cmd)["Id"]
        api.exec_start(exec_id)
        assert api.exec_inspect(exec_id)["ExitCode"] == 0

    report("raw SDK exec python3 -c pass", timed(lambda: sdk_exec(CMD), runs))
    report(
        "provider exec python3 -c pass",
        timed(
            lambda: provider.exec(handle.provider_id, ExecRequest(command=CMD[0], args=CMD[1:])),
            runs,
        ),
    )
    report("raw SDK exec true", timed(lambda: sdk_exec(["true"]), runs))
    report(
        "provider exec true",
        timed(
            lambda: provider.exec(handle.provider_id, ExecRequest(command="true", args=[])), runs
        ),
    )
    report(
        "provider write_file 1 KiB",
        timed(lambda: provider.write_file(handle.provider_id, "b.txt", b"x" * 1024), runs),
    )
    report(
        "provider read_file 1 KiB",
        timed(lambda: provider.read_file(handle.provider_id, "b.txt"), runs),
    )
    provider.destroy(handle.provider_id)
    report("provider destroy", destroy)


if __name__ == "__main__":
    main()
