"""Snapshot and fork of a sandbox holding 100 MB of files, beside `cp -a` and `tar` of the same
files on the host, all in the same run (provider level: what the API adds is one row write).

  snapshot: provider.snapshot(...)   -> a zstd archive of /workspace and /tmp
  fork:     provider.create(restore_from=...) until the new sandbox answers a command
  floors:   `cp -a` of the same tree; `tar -cf` of it to a file; `tar -xf` of that file;
            docker: `docker exec <sandbox> tar -cf - > file` (the engine's exec stream alone)

The data: 100 files of 1 MiB from /dev/urandom (incompressible, the worst case for the
archive's size) in /workspace/data, made in the sandbox and, for the floors, on the host in
the same file system the snapshots are written to.

Run:  .venv/bin/python bench/bench_snapshot.py [--provider local|docker|both] [--runs 5]
      [--mb 100]
Only the ratios travel between machines.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sandboxes.providers.base import ExecRequest, Resources, SandboxSpec  # noqa: E402

MAKE_DATA = (
    "mkdir -p data && for i in $(seq 1 {n}); do head -c 1048576 /dev/urandom > data/f$i; done"
)


def p50(samples: list[float]) -> float:
    return statistics.median(samples)


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000


def provider_for(name: str, scratch: Path):  # type: ignore[no-untyped-def]
    if name == "local":
        from sandboxes.providers.local import LocalProvider

        root = Path(tempfile.mkdtemp(prefix="bench-snap-", dir="/tmp"))
        os.chmod(root, 0o711)  # noqa: S103 - jail uids pass through
        return LocalProvider(root_dir=root), root
    from sandboxes.providers.docker import DockerProvider

    image = os.environ.get("SANDPIT_DOCKER_IMAGE", "sandpit-sandbox:latest")
    return DockerProvider(image=image, installation="bench"), None


def run(name: str, runs: int, mb: int, scratch: Path) -> dict[str, float]:
    provider, root = provider_for(name, scratch)
    spec_resources = Resources(disk_mb=max(512, mb * 3), memory_mb=max(512, mb * 4))
    made: list[str] = []
    try:
        source = provider.create(
            SandboxSpec(sandbox_id="bs" + uuid.uuid4().hex[:10], resources=spec_resources)
        ).provider_id
        made.append(source)
        result = provider.exec(source, ExecRequest(command=MAKE_DATA.format(n=mb), timeout_s=300))
        assert result.exit_code == 0, result.stderr
        snapshots, forks, sizes, raw_exec = [], [], [], []
        for i in range(runs):
            if name == "docker":  # the engine's own floor: its exec stream, CLI, no compression
                out = scratch / "exec-floor.tar"
                raw_exec.append(
                    timed(
                        lambda o=out: subprocess.run(
                            f"docker exec {source} tar -C / -cf - workspace > {o}",
                            shell=True,  # noqa: S602 - our own command line
                            check=True,
                        )
                    )
                )
                out.unlink()
            target = scratch / f"{name}-{i}.tar.zst"
            started = time.perf_counter()
            archive = provider.snapshot(source, str(target), 10**12)
            snapshots.append((time.perf_counter() - started) * 1000)
            sizes.append(archive.size_bytes)

            def fork(location: str = archive.location) -> None:
                fork_id = provider.create(
                    SandboxSpec(
                        sandbox_id="bf" + uuid.uuid4().hex[:10],
                        resources=spec_resources,
                        restore_from=location,
                    )
                ).provider_id
                made.append(fork_id)
                answer = provider.exec(fork_id, ExecRequest(command="true"))
                assert answer.exit_code == 0

            forks.append(timed(fork))
            provider.destroy(made.pop())
            os.unlink(target)
    finally:
        for provider_id in made:
            provider.destroy(provider_id)
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)
    return {
        "exec_tar_ms": p50(raw_exec) if raw_exec else 0.0,
        "snapshot_ms": p50(snapshots),
        "fork_ms": p50(forks),
        "archive_mb": p50(sizes) / 1e6,
    }


def floors(runs: int, mb: int, scratch: Path) -> dict[str, float]:
    data = scratch / "floor-src"
    (data / "data").mkdir(parents=True)
    for i in range(1, mb + 1):
        (data / "data" / f"f{i}").write_bytes(os.urandom(1024 * 1024))
    cps, tars, untars = [], [], []
    for i in range(runs):
        copy = scratch / f"floor-cp-{i}"
        cps.append(
            timed(lambda c=copy: subprocess.run(["cp", "-a", str(data), str(c)], check=True))
        )
        shutil.rmtree(copy)
        archive = scratch / f"floor-{i}.tar"
        tars.append(
            timed(
                lambda a=archive: subprocess.run(
                    ["tar", "-C", str(data), "-cf", str(a), "data"], check=True
                )
            )
        )
        out = scratch / f"floor-x-{i}"
        out.mkdir()
        untars.append(
            timed(
                lambda a=archive, o=out: subprocess.run(
                    ["tar", "-C", str(o), "-xf", str(a)], check=True
                )
            )
        )
        shutil.rmtree(out)
        archive.unlink()
    shutil.rmtree(data)
    return {"cp_a_ms": p50(cps), "tar_c_ms": p50(tars), "tar_x_ms": p50(untars)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--provider", choices=["local", "docker", "both"], default="both")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--mb", type=int, default=100)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "playground.settings")
    scratch = Path(tempfile.mkdtemp(prefix="bench-snapshot-", dir=str(ROOT / "var")))
    try:
        floor = floors(args.runs, args.mb, scratch)
        print(
            f"floors ({args.mb} MB, p50 of {args.runs}): cp -a {floor['cp_a_ms']:.0f} ms, "
            f"tar -cf {floor['tar_c_ms']:.0f} ms, tar -xf {floor['tar_x_ms']:.0f} ms"
        )
        names = ["local", "docker"] if args.provider == "both" else [args.provider]
        for name in names:
            got = run(name, args.runs, args.mb, scratch)
            print(
                f"{name:6s}: snapshot {got['snapshot_ms']:.0f} ms "
                f"({got['snapshot_ms'] / floor['tar_c_ms']:.2f}x tar -cf, "
                f"{got['snapshot_ms'] / floor['cp_a_ms']:.2f}x cp -a), "
                f"fork {got['fork_ms']:.0f} ms ({got['fork_ms'] / floor['tar_x_ms']:.2f}x "
                f"tar -xf, {got['fork_ms'] / floor['cp_a_ms']:.2f}x cp -a), "
                f"archive {got['archive_mb']:.1f} MB"
                + (
                    f"; `docker exec tar -cf - > file` alone {got['exec_tar_ms']:.0f} ms"
                    if got["exec_tar_ms"]
                    else ""
                )
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
