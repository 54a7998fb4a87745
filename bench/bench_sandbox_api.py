"""Sandbox API latency beside the raw floor, measured in the same run.

    .venv/bin/python bench/bench_sandbox_api.py [--providers local,docker] [--runs 30]

For each provider: API create → first command result, and the command round trip, with
1, 10 and 50 live sandboxes. Each API sample is taken right after a sample of its floor
(interleaved, so this machine's drifting speed moves both alike): `bwrap ... python3 -c pass`
for local, `docker run --rm IMAGE python3 -c pass` and `docker exec` for docker. The API runs
the same argv (`{"command": "python3", "args": ["-c", "pass"]}`); the shell form is shown too.
Each block ends with the issue's targets at p50, met or not. Five untimed rounds per provider
come first (server start-up and the warm pool's first fill are not steady-state costs).
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
IMAGE = "sandpit-sandbox:latest"
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


def row(name: str, samples: list[float]) -> str:
    return (
        f"{name:<48} p50 {percentile(samples, 50):8.1f} ms   p95 {percentile(samples, 95):8.1f} ms"
    )


class Floors:
    """The raw floor for one provider, sampled between the API's samples (interleaved), so a
    drift in this machine's speed moves both sides of a comparison alike."""

    def __init__(self, provider: str) -> None:
        self.provider = provider
        self.cid = ""
        if provider == "local":
            self.create_name = "raw bwrap spawn `python3 -c pass`"
            self.exec_name = self.create_name
            self.true_name = "raw bwrap spawn `true`"
        else:
            self.create_name = "raw `docker run --rm` python3 -c pass"
            self.exec_name = "raw `docker exec` python3 -c pass"
            self.true_name = "raw `docker exec` true"
            self.cid = subprocess.run(
                ["docker", "run", "-d", "--rm", "--network", "none", IMAGE, "sleep", "3600"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()

    def close(self) -> None:
        if self.cid:
            subprocess.run(["docker", "rm", "-f", self.cid], capture_output=True)

    def _run(self, argv: list[str]) -> float:
        started = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        return (time.perf_counter() - started) * 1000

    def create(self) -> float:
        """A fresh environment running the command: what API create + first command does."""
        if self.provider == "local":
            return self._run([*BWRAP, "python3", "-c", "pass"])
        return self._run(
            ["docker", "run", "--rm", "--network", "none", IMAGE, "python3", "-c", "pass"]
        )

    def exec(self, *argv: str) -> float:
        """The command in an environment: what the API's command round trip does."""
        if self.provider == "local":
            return self._run([*BWRAP, *argv])
        return self._run(["docker", "exec", self.cid, *argv])


def product(api: Api, floors: Floors, runs: int, live: int) -> dict[str, list[float]]:
    provider = floors.provider
    extra = []
    for _ in range(live - 1):
        status, body = api.call("POST", "/api/v1/sandboxes", {"provider": provider})
        assert status == 201, body
        extra.append(body["id"])
    out: dict[str, list[float]] = {}

    def sample(name: str, value: float) -> None:
        out.setdefault(name, []).append(value)

    create_runs = runs if provider == "local" else max(5, runs // 3)
    try:
        for _ in range(create_runs):
            sample(floors.create_name, floors.create())
            started = time.perf_counter()
            status, body = api.call("POST", "/api/v1/sandboxes", {"provider": provider})
            assert status == 201, body
            status, result = api.call(
                "POST", f"/api/v1/sandboxes/{body['id']}/commands", ARGV_COMMAND
            )
            sample("API create + first command", (time.perf_counter() - started) * 1000)
            assert status == 200 and result["exit_code"] == 0, result
            api.call("DELETE", f"/api/v1/sandboxes/{body['id']}")
        status, body = api.call("POST", "/api/v1/sandboxes", {"provider": provider})
        sid = body["id"]
        commands = f"/api/v1/sandboxes/{sid}/commands"
        for _ in range(runs):
            # For local this is the same floor as create's (one bwrap spawn): one list.
            sample(floors.exec_name, floors.exec("python3", "-c", "pass"))
            started = time.perf_counter()
            status, result = api.call("POST", commands, ARGV_COMMAND)
            sample("API command round trip", (time.perf_counter() - started) * 1000)
            assert status == 200 and result["exit_code"] == 0, result
            started = time.perf_counter()
            status, result = api.call("POST", commands, {"command": COMMAND})
            sample("  same, shell form `sh -c`", (time.perf_counter() - started) * 1000)
            assert status == 200 and result["exit_code"] == 0, result
            sample(floors.true_name, floors.exec("true"))
            started = time.perf_counter()
            api.call("POST", commands, {"command": "true", "args": []})
            sample("  API command `true`", (time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            api.call("GET", f"/api/v1/sandboxes/{sid}")
            sample("  API read, no provider call", (time.perf_counter() - started) * 1000)
        api.call("DELETE", f"/api/v1/sandboxes/{sid}")
    finally:
        for sid in extra:
            api.call("DELETE", f"/api/v1/sandboxes/{sid}")
    return out


def verdicts(provider: str, floors: Floors, samples: dict[str, list[float]]) -> list[str]:
    """The issue's targets, at p50, against the floor sampled in the same loop."""

    def p50(name: str) -> float:
        return percentile(samples[name], 50)

    create, rtt = p50("API create + first command"), p50("API command round trip")
    if provider == "local":
        create_target = 2 * p50(floors.create_name) + 10
        create_rule = "<= 2 x bwrap spawn + 10 ms"
    else:
        create_target = 1.2 * p50(floors.create_name)
        create_rule = "<= 1.2 x docker run"
    rtt_target = p50(floors.exec_name) + 5
    return [
        f"  target create + first {create_rule}: {create:.1f} vs {create_target:.1f} ms "
        f"-> {'met' if create <= create_target else 'NOT met'}",
        f"  target round trip <= floor + 5 ms: {rtt:.1f} vs {rtt_target:.1f} ms "
        f"-> {'met' if rtt <= rtt_target else 'NOT met'}",
    ]


def warm_up(api: Api, floors: Floors, rounds: int = 5) -> None:
    """Untimed rounds first: the server's first requests (imports, connection pools) and the
    local warm pool's first fill are start-up costs, not what a running server pays."""
    for _ in range(rounds):
        floors.create()
        status, body = api.call("POST", "/api/v1/sandboxes", {"provider": floors.provider})
        assert status == 201, body
        api.call("POST", f"/api/v1/sandboxes/{body['id']}/commands", ARGV_COMMAND)
        api.call("DELETE", f"/api/v1/sandboxes/{body['id']}")


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
            floors = Floors(provider)
            try:
                warm_up(api, floors)
                for live in [int(n) for n in args.live.split(",")]:
                    print(f"\n== {provider}, {live} live ==")
                    samples = product(api, floors, args.runs, live)
                    for name, values in samples.items():
                        print(row(name, values))
                    print("\n".join(verdicts(provider, floors, samples)))
            finally:
                floors.close()


if __name__ == "__main__":
    main()
