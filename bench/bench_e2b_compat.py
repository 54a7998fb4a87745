"""The e2b SDK against Sandpit beside Sandpit's own API, measured in the same run.

    .venv/bin/python bench/bench_e2b_compat.py [--providers local,docker] [--runs 20]

Per provider, interleaved sample by sample (this machine's drifting speed moves both alike):
- e2b: `Sandbox.create()` → first `commands.run("true")` through the unmodified e2b SDK
  (E2B_API_URL / E2B_SANDBOX_URL on Sandpit's /e2b), then `kill()`.
- sandpit: POST /api/v1/sandboxes → POST .../commands {"command": "true"}, then DELETE.
Also the command round trip alone on a live sandbox, both ways. Five untimed rounds first.
"""

from __future__ import annotations

import argparse
import os
import time

from _server import Api, bench_env, create_org_and_key, daphne, ensure_database, percentile


def row(name: str, samples: list[float]) -> str:
    return (
        f"{name:<52} p50 {percentile(samples, 50):8.1f} ms   p95 {percentile(samples, 95):8.1f} ms"
    )


def _run_true(sbx) -> int:  # type: ignore[no-untyped-def]
    """Run `true`; 1 when its exit status was lost (reported -1: reported, not hidden, so
    a regression of the streamed run's end shows here), else 0."""
    from e2b.sandbox.commands.command_handle import CommandExitException

    try:
        sbx.commands.run("true")
    except CommandExitException as exc:
        if exc.exit_code != -1:
            raise
        return 1
    return 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--providers", default="local")
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    providers = args.providers.split(",")
    env = bench_env({"SANDPIT_PROVIDERS": ",".join(providers)})
    ensure_database(env)
    key = create_org_and_key(env)
    with daphne(env) as port:
        os.environ.update(
            E2B_API_URL=f"http://127.0.0.1:{port}/e2b",
            E2B_SANDBOX_URL=f"http://127.0.0.1:{port}/e2b",
            E2B_API_KEY=key,
        )
        from e2b import Sandbox

        api = Api(port, key)
        for provider in providers:
            e2b_first: list[float] = []
            own_first: list[float] = []
            e2b_rt: list[float] = []
            own_rt: list[float] = []
            lost = 0
            for i in range(args.runs + 5):
                start = time.perf_counter()
                sbx = Sandbox.create(template=provider)
                lost += _run_true(sbx)
                first = (time.perf_counter() - start) * 1000
                start = time.perf_counter()
                lost += _run_true(sbx)
                rt = (time.perf_counter() - start) * 1000
                sbx.kill()
                start = time.perf_counter()
                status, body = api.call("POST", "/api/v1/sandboxes", {"provider": provider})
                assert status == 201, body
                sandbox_id = body["id"]  # type: ignore[index]
                status, result = api.call(
                    "POST", f"/api/v1/sandboxes/{sandbox_id}/commands", {"command": "true"}
                )
                own = (time.perf_counter() - start) * 1000
                assert status == 200, result
                start = time.perf_counter()
                api.call("POST", f"/api/v1/sandboxes/{sandbox_id}/commands", {"command": "true"})
                own_round = (time.perf_counter() - start) * 1000
                api.call("DELETE", f"/api/v1/sandboxes/{sandbox_id}")
                if i >= 5:
                    e2b_first.append(first)
                    own_first.append(own)
                    e2b_rt.append(rt)
                    own_rt.append(own_round)
            print(f"== {provider} ({args.runs} runs)")
            print(row("e2b SDK: create -> first commands.run('true')", e2b_first))
            print(row("Sandpit API: create -> first command 'true'", own_first))
            print(row("e2b SDK: commands.run('true') round trip", e2b_rt))
            print(row("Sandpit API: command 'true' round trip", own_rt))
            print(f"e2b runs whose exit status was lost: {lost}")


if __name__ == "__main__":
    main()
