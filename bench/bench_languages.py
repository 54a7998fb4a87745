"""Compile-and-run cost of /code's steps in a local jail, beside the same compiler and
program run straight on the host, in the same run.

  sandpit: code_run (write+compile, run, clean-up: three execs in one jail)
  floor:   the same argv on the host in a temp directory (subprocess, no jail)

Run:  .venv/bin/python bench/bench_languages.py [--runs 7] [--languages c,cpp,java,python]
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "playground.settings")

from sandboxes import languages as table  # noqa: E402
from sandboxes.code_runs import build_plan, code_run  # noqa: E402
from sandboxes.providers.base import ExecRequest, SandboxSpec  # noqa: E402
from sandboxes.providers.local import LocalProvider  # noqa: E402


def floor_once(language: table.Language, toolchain: table.Toolchain) -> float:
    """The same steps on the host: write, compile, run, remove."""
    with tempfile.TemporaryDirectory() as tmp:
        plan = build_plan(language, toolchain, language.sample, "x")
        swap = {plan.directory: tmp}

        def host(argv: tuple[str, ...]) -> list[str]:
            out = []
            for arg in argv:
                for old, new in swap.items():
                    arg = arg.replace(old, new)
                out.append(arg)
            return out

        started = time.perf_counter()
        Path(host((plan.source,))[0]).write_text(language.sample)
        # The jail's PATH: the host's /usr binaries, not a version manager's shims.
        env = {**os.environ, "PATH": "/usr/local/bin:/usr/bin:/bin"}
        env.update({k: host((v,))[0] for k, v in plan.env.items()})
        if plan.compile:
            subprocess.run(host(plan.compile), check=True, capture_output=True, env=env)  # noqa: S603
        if toolchain.inline and not plan.compile:
            argv = [*toolchain.inline, language.sample]
            argv[0] = f"/usr/bin/{argv[0]}"
        else:
            argv = host(plan.run)
        done = subprocess.run(argv, check=True, capture_output=True, env=env)  # noqa: S603
        assert done.stdout == b"Hello, world!\n", done
        return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--languages", default="python,c,cpp,java")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-languages-", dir="/tmp"))
    os.chmod(root, 0o711)  # noqa: S103 - jail uids pass through
    provider = LocalProvider(root_dir=root)
    handle = provider.create(SandboxSpec(sandbox_id="sbx_bench_languages"))
    try:
        argv = table.probe_argv()
        probe = provider.exec(handle.provider_id, ExecRequest(command=argv[0], args=argv[1:]))
        present = table.present_binaries(probe.stdout.decode())
        print(f"{'language':<10} {'sandpit p50 ms':>15} {'host floor p50 ms':>18} {'ratio':>7}")
        for name in args.languages.split(","):
            language = table.BY_NAME[name]
            toolchain = language.toolchain(present.__contains__)
            if toolchain is None:
                print(f"{name:<10} (not in the local default jail here)")
                continue

            def exec_(request: ExecRequest) -> object:
                return provider.exec(handle.provider_id, request)

            sandpit, floor = [], []
            for _ in range(args.runs):
                started = time.perf_counter()
                run = code_run(
                    exec_,  # type: ignore[arg-type]
                    language=language,
                    toolchain=toolchain,
                    code=language.sample,
                    timeout_s=60,
                    compile_timeout_s=60,
                    stdin=None,
                    max_output_bytes=1 << 20,
                )
                sandpit.append((time.perf_counter() - started) * 1000)
                assert run.result.stdout == b"Hello, world!\n", run
                floor.append(floor_once(language, toolchain))
            s, f = statistics.median(sandpit), statistics.median(floor)
            print(f"{name:<10} {s:>15.1f} {f:>18.1f} {s / f:>7.2f}")
    finally:
        provider.destroy(handle.provider_id)


if __name__ == "__main__":
    main()
