"""Starting a sandbox from a template, beside the default environment and the raw floor, all
in the same run (provider level: the API adds one row read for the template).

  local:  create(rootfs=<template>) + `python3 -c pass`   vs  create() + the same
          floor: `bwrap --ro-bind <template rootfs> / ... python3 -c pass`
  docker: create(image=<template>) + `python3 -c pass`    vs  create() + the same
          floor: `docker run --rm --network none <template image> python3 -c pass`
  build:  `templates_builtin_build` of an up-to-date built-in (the cached check make test does)

The template is the built-in `python` (built first if it is not: minutes). Warm pools off,
so both sides start cold (a template sandbox always does).

Run:  .venv/bin/python bench/bench_templates.py [--provider local|docker|both] [--runs 10]
Only the ratios travel between machines.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "playground.settings")

import django  # noqa: E402

django.setup()

from sandboxes.providers.base import ExecRequest, SandboxSpec  # noqa: E402
from sandboxes.template_builtins import templates_builtin_build  # noqa: E402

PROBE = "python3 -c pass"


def ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1000


def sandbox_once(provider, **spec: str) -> float:  # type: ignore[no-untyped-def]
    sandbox_id = "bench" + uuid.uuid4().hex[:10]
    started = time.perf_counter()
    handle = provider.create(SandboxSpec(sandbox_id=sandbox_id, **spec))
    try:
        result = provider.exec(handle.provider_id, ExecRequest(command=PROBE))
        elapsed = ms_since(started)
    finally:
        provider.destroy(handle.provider_id)
    if result.exit_code != 0:
        raise RuntimeError(f"{PROBE} failed: {result.stderr[-300:]}")
    return elapsed


def floor_once(argv: list[str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"floor failed: {done.stderr.decode(errors='replace')[-300:]}")
    return ms_since(started)


def bwrap_floor(rootfs: str) -> list[str]:
    return [
        "bwrap",
        "--ro-bind",
        rootfs,
        "/",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "--unshare-all",
        "--die-with-parent",
        "python3",
        "-c",
        "pass",
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--provider", choices=["local", "docker", "both"], default="both")
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()

    started = time.perf_counter()
    [template] = templates_builtin_build(["python"], record=False)
    if template.state != "ready":
        raise SystemExit(f"the python template is {template.state}: {template.error_message}")
    print(f"built-in python up to date (checked, or built) in {ms_since(started):.0f} ms")
    started = time.perf_counter()
    templates_builtin_build(["python"], record=False)
    print(f"cached check of the built-in python: {ms_since(started):.0f} ms")

    rows: list[tuple[str, float, float, float]] = []
    if args.provider in ("local", "both"):
        from sandboxes.providers.local import LocalProvider

        root = Path(tempfile.mkdtemp(prefix="bench-tpl-", dir="/tmp"))
        os.chmod(root, 0o711)  # noqa: S103 - jail uids pass through
        local = LocalProvider(root_dir=root, warm_pool=0)
        default = [sandbox_once(local) for _ in range(args.runs)]
        templated = [sandbox_once(local, rootfs=template.rootfs) for _ in range(args.runs)]
        floor = [floor_once(bwrap_floor(template.rootfs)) for _ in range(args.runs)]
        rows.append(("local", *map(statistics.median, (default, templated, floor))))
    if args.provider in ("docker", "both"):
        from sandboxes.providers.docker import DockerProvider

        image = os.environ.get("SANDPIT_DOCKER_IMAGE", "sandpit-sandbox:latest")
        docker = DockerProvider(image=image, installation="bench")
        default = [sandbox_once(docker) for _ in range(args.runs)]
        templated = [sandbox_once(docker, image=template.image) for _ in range(args.runs)]
        argv = ["docker", "run", "--rm", "--network", "none", template.image, *PROBE.split()]
        floor = [floor_once(argv) for _ in range(args.runs)]
        rows.append(("docker", *map(statistics.median, (default, templated, floor))))

    print(f"\ncreate + first `{PROBE}`, p50 of {args.runs} (ms)")
    print(f"{'provider':<8} {'default':>9} {'template':>9} {'floor':>9} {'tpl/floor':>10}")
    for name, default_ms, template_ms, floor_ms in rows:
        print(
            f"{name:<8} {default_ms:9.0f} {template_ms:9.0f} {floor_ms:9.0f} "
            f"{template_ms / floor_ms:9.2f}x"
        )


if __name__ == "__main__":
    main()
