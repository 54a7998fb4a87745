"""API command round trips on local and docker, alternated in one loop, same server.

    .venv/bin/python bench/bench_api_local_vs_docker.py [runs]

bench_sandbox_api.py measures each provider in a block of its own, with its floor sampled
between API samples; Docker's floor (`docker exec`) loads this machine far more than
bwrap's, so its block runs on a busier machine. Here one local and one docker sandbox
take turns (the order flips every round) with nothing else in between, which is what
"docker's round trip p50 against local's in the same run" asks. The first 5 rounds are
not counted (connection pools, first calls).
"""

from __future__ import annotations

import sys
import time

from _server import Api, bench_env, create_org_and_key, daphne, ensure_database, percentile

COMMANDS = {
    "true": {"command": "true", "args": []},
    "python3 -c pass": {"command": "python3", "args": ["-c", "pass"]},
}
WARM_UP = 5


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    env = bench_env({"SANDPIT_PROVIDERS": "local,docker"})
    ensure_database(env)
    key = create_org_and_key(env)
    with daphne(env) as port:
        api = Api(port, key)
        sandboxes: dict[str, str] = {}
        samples: dict[tuple[str, str], list[float]] = {}
        try:
            for provider in ("local", "docker"):
                status, body = api.call("POST", "/api/v1/sandboxes", {"provider": provider})
                assert status == 201, body
                sandboxes[provider] = body["id"]
            for i in range(WARM_UP + runs):
                for provider in ("local", "docker") if i % 2 else ("docker", "local"):
                    for name, payload in COMMANDS.items():
                        started = time.perf_counter()
                        status, result = api.call(
                            "POST", f"/api/v1/sandboxes/{sandboxes[provider]}/commands", payload
                        )
                        elapsed = (time.perf_counter() - started) * 1000
                        assert status == 200 and result["exit_code"] == 0, result
                        if i >= WARM_UP:
                            samples.setdefault((provider, name), []).append(elapsed)
        finally:
            for sandbox_id in sandboxes.values():
                api.call("DELETE", f"/api/v1/sandboxes/{sandbox_id}")
    for name in COMMANDS:
        local = percentile(samples[("local", name)], 50)
        docker = percentile(samples[("docker", name)], 50)
        print(
            f"API command `{name}`: local p50 {local:.1f} ms, docker p50 {docker:.1f} ms"
            f" -> {docker / local:.2f}x (target <= 1.3x)"
        )


if __name__ == "__main__":
    main()
