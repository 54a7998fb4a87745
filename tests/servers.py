"""Start a Sandpit web server as a subprocess on 127.0.0.1, for tests that need a real one."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[1]


def server_start(
    port: int,
    env: dict[str, str],
    out: IO[bytes],
    *,
    module: str = "playground.webserver",
    through: Sequence[str] = (),
) -> subprocess.Popen[bytes]:
    """`python -m <module> -b 127.0.0.1 -p <port> playground.asgi:application` from the
    checkout, stdout and stderr to `out`. `module`: the product's launcher, or "daphne";
    `through`: a command that launches it (e.g. tests/unfriendly_launch.py's)."""
    return subprocess.Popen(
        [
            *through,
            sys.executable,
            "-m",
            module,
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            "playground.asgi:application",
        ],
        cwd=ROOT,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
    )
