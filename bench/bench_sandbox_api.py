"""Sandbox API latency beside the raw floor, measured in the same run.

    .venv/bin/python bench/bench_sandbox_api.py [--providers local,docker] [--runs 30]

For each provider: API create → first command result, and the command round trip, with
1, 10 and 50 live sandboxes; beside the floor: `bwrap ... python3 -c pass` for local,
`docker run --rm IMAGE python3 -c pass` and `docker exec` for docker. The API runs the same
argv (`{"command": "python3", "args": ["-c", "pass"]}`); the shell form is shown too.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import time

from _server import Api, bench_env, create_org_and_key, daphne, ensure_database, percentile

COMMAND = "python3 -c pass"
# The floor runs this argv without a shell, so the API's `args` form is the same command;
# the shell form (`sh -c`, what `command` alone means) is reported beside it.
ARGV_COMMAND = {"command": "python3", "args": ["-c", "pass"]}
BWRAP = [
    "bwrap",
    "--ro-bind",
    "/usr",
    "/usr",
    "--symlink",
    "usr/bin",
    "/bin",
    "--symlink",
    "usr/lib",
    "/lib",
    "--symlink",
    "usr/lib64",
    "/lib64",
    "--proc",
    "/proc",
    "--dev",
    "/dev",
    "--tmpfs",
    "/tmp",
    "--unshare-all",
    "--die-with-parent",
    "--cap-drop",
    "ALL",
]


def timed(fn, runs: int) -> list[float]:  # type: ignore[no-untyped-def]
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def row(name: str, samples: list[float]) -> str:
    return (
        f"{name:<48} p50 {percentile(samples, 50):8.1f} ms   p95 {percentile(samples, 95):8.1f} ms"
    )


def floors(provider: str, runs: int) -> dict[str, list[float]]:
    if provider == "local":
        return {
            "raw bwrap spawn `python3 -c pass`": timed(
                lambda: subprocess.run([*BWRAP, "python3", "-c", "pass"], check=True), runs
            ),
            "raw bwrap spawn `true`": timed(
                lambda: subprocess.run([*BWRAP, "true"], check=True), runs
            ),
        }
    image = "sandpit-sandbox:latest"
    out = {
        "raw `docker run --rm` python3 -c pass": timed(
            lambda: subprocess.run(
                ["docker", "run", "--rm", "--network", "none", image, "python3", "-c", "pass"],
                check=True,
                capture_output=True,
            ),
            max(5, runs // 3),
        )
    }
    cid = subprocess.run(
        ["docker", "run", "-d", "--rm", image, "sleep", "300"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    try:
        out["raw `docker exec` python3 -c pass"] = timed(
            lambda: subprocess.run(
                ["docker", "exec", cid, "python3", "-c", "pass"], check=True, capture_output=True
            ),
            runs,
        )
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True)
    return out


def product(api: Api, provider: str, runs: int, live: int) -> dict[str, list[float]]:
    extra = []
    for _ in range(live - 1):
        status, body = api.call("POST", "/api/v1/sandboxes", {"provider": provider})
        assert status == 201, body
        extra.append(body["id"])
    create_samples, rtt_samples = [], []
    create_runs = runs if provider == "local" else max(5, runs // 3)
    try:
        for _ in range(create_runs):
            started = time.perf_counter()
            status, body = api.call("POST", "/api/v1/sandboxes", {"provider": provider})
            assert status == 201, body
            status, result = api.call(
                "POST", f"/api/v1/sandboxes/{body['id']}/commands", ARGV_COMMAND
            )
            create_samples.append((time.perf_counter() - started) * 1000)
            assert status == 200 and result["exit_code"] == 0, result
            api.call("DELETE", f"/api/v1/sandboxes/{body['id']}")
        status, body = api.call("POST", "/api/v1/sandboxes", {"provider": provider})
        sid = body["id"]
        read_samples, true_samples = [], []
        for _ in range(runs):
            started = time.perf_counter()
            api.call("GET", f"/api/v1/sandboxes/{sid}")
            read_samples.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            api.call("POST", f"/api/v1/sandboxes/{sid}/commands", {"command": "true"})
            true_samples.append((time.perf_counter() - started) * 1000)
        shell_samples = []
        for _ in range(runs):
            started = time.perf_counter()
            status, result = api.call("POST", f"/api/v1/sandboxes/{sid}/commands", ARGV_COMMAND)
            rtt_samples.append((time.perf_counter() - started) * 1000)
            assert status == 200 and result["exit_code"] == 0, result
            started = time.perf_counter()
            status, result = api.call(
                "POST", f"/api/v1/sandboxes/{sid}/commands", {"command": COMMAND}
            )
            shell_samples.append((time.perf_counter() - started) * 1000)
            assert status == 200 and result["exit_code"] == 0, result
        api.call("DELETE", f"/api/v1/sandboxes/{sid}")
    finally:
        for sid in extra:
            api.call("DELETE", f"/api/v1/sandboxes/{sid}")
    return {
        f"API create + first command ({live} live)": create_samples,
        f"API command round trip ({live} live)": rtt_samples,
        f"  same, shell form `sh -c` ({live} live)": shell_samples,
        f"  API read, no provider call ({live} live)": read_samples,
        f"  API command `true` ({live} live)": true_samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--providers", default="local,docker")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--live", default="1,10,50")
    args = parser.parse_args()
    providers = [p for p in args.providers.split(",") if p]
    if "docker" in providers and not shutil.which("docker"):
        providers.remove("docker")
    env = bench_env({"SANDPIT_PROVIDERS": ",".join(providers)})
    ensure_database(env)
    key = create_org_and_key(env)
    with daphne(env) as port:
        api = Api(port, key)
        for provider in providers:
            print(f"\n== {provider} ==")
            for name, samples in floors(provider, args.runs).items():
                print(row(name, samples))
            for live in [int(n) for n in args.live.split(",")]:
                for name, samples in product(api, provider, args.runs, live).items():
                    print(row(name, samples))


if __name__ == "__main__":
    main()
