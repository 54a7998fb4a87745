"""Start a Sandpit web server as a subprocess on 127.0.0.1, for tests that need a real one."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import httpx

ROOT = Path(__file__).resolve().parents[1]

TEST_PORTS_FIRST = 21000
TEST_PORTS_PER_WORKER = 500
"""Test servers listen on ports of a block of their own per pytest-xdist worker (21000-22999
for the at most 4 workers scripts/test.sh starts), below the kernel's ephemeral range."""

_next_in_block = itertools.count()


def worker_index() -> int:
    """0 for pytest's own process and gw0, 1 for gw1, and so on."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker.removeprefix("gw")) if worker.startswith("gw") else 0


def free_port() -> int:
    """A port nothing listens on, for a server a test starts next.

    Binding port 0 and releasing it let the kernel hand the same port to another worker
    before this one's server bound it (and to outgoing connections, which draw from the
    same range). A block per worker, walked in turn, leaves only ports this worker's
    earlier tests used, and those are checked free."""
    first = TEST_PORTS_FIRST + worker_index() * TEST_PORTS_PER_WORKER
    for _ in range(TEST_PORTS_PER_WORKER):
        port = first + next(_next_in_block) % TEST_PORTS_PER_WORKER
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {first}-{first + TEST_PORTS_PER_WORKER - 1}")


def server_start(
    port: int,
    env: dict[str, str],
    out: IO[bytes],
    *,
    module: str = "playground.webserver",
    through: Sequence[str] = (),
    app: str = "playground.asgi:application",
) -> subprocess.Popen[bytes]:
    """`python -m <module> -b 127.0.0.1 -p <port> <app>` from the checkout, stdout and
    stderr to `out`. `module`: the product's launcher, or "daphne"; `through`: a command
    that launches it (e.g. tests/unfriendly_launch.py's); `app`: the ASGI application."""
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
            app,
        ],
        cwd=ROOT,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
    )


def embedded_env(var: Path, jails: Path, **extra: str) -> dict[str, str]:
    """The environment of the README's run command on its embedded defaults (SQLite in
    `var`, no Redis, the local provider with its jails under `jails`), `extra` added."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE", "SANDPIT_PROVIDERS"}
    }
    env.update(
        SANDPIT_VAR_DIR=str(var),
        SANDPIT_SQLITE_PATH=str(var / "db.sqlite3"),
        SANDPIT_LOCAL_ROOT=str(jails),
        **extra,
    )
    return env


def manage(env: dict[str, str], *args: str) -> str:
    """`manage.py <args>` from the checkout in `env`: its standard output."""
    return subprocess.run(
        [str(ROOT / ".venv/bin/python"), "manage.py", *args],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


@contextmanager
def make_run(env: dict[str, str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The README's run command (`make run`: web server, worker and beat) in a session of
    its own, its output to `log_path`; the whole session stopped on the way out."""
    with log_path.open("wb") as out:
        process = subprocess.Popen(
            ["make", "run"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield process
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def jails_destroyed(root: Path) -> int:
    """Destroy every sandbox left under a local jail root (local sandboxes outlive the
    server that made them: a test that failed before its own destroy leaves them running);
    how many there were."""
    from sandboxes.providers.local.provider import LocalProvider

    provider = LocalProvider(root_dir=root, warm_pool=0)
    left = provider.list_sandboxes()
    for handle in left:
        provider.destroy(handle.provider_id)
    return len(left)


def wait_until_serving(
    base: str, process: subprocess.Popen[bytes], log: Path, timeout_s: float = 60
) -> None:
    """Until `base`/health/live answers 200; fails with the server's log if it exits or
    the time runs out first."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(base + "/health/live", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-5000:]
        time.sleep(0.1)


def server_stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 20 s."""
    process.terminate()
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def live_server_env(redis_url: str, installation: str) -> dict[str, str]:
    """The environment of a server sharing this test's PostgreSQL database and Redis, as
    installation `installation` (whose meter keys are its own)."""
    from django.db import connection

    db = connection.settings_dict
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "playground.settings",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        "REDIS_URL": redis_url,
        "SANDPIT_INSTALLATION": installation,
    }


@contextmanager
def serving_test_database(
    settings: Any, log_path: Path, *, module: str, **extra_env: str
) -> Iterator[tuple[str, Path]]:
    """A server (`module`: the product's launcher or "daphne") on a free loopback port, on
    this test's PostgreSQL database and Redis prefix, with a local jail root of its own: its
    URL and that root. Stopped (and the root removed) on the way out. `extra_env` adds to or
    overrides the environment (the warm pool, for one)."""
    # Short: AF_UNIX paths to the agents' sockets under it are limited to 107 bytes (pytest's
    # tmp_path is too long).
    local_root = tempfile.mkdtemp(prefix="sp-", dir="/tmp")
    env = {
        **live_server_env(settings.REDIS_URL, settings.SANDPIT_INSTALLATION),
        "SANDPIT_API_RATE": "1000000/min",
        "SANDPIT_LOCAL_ROOT": local_root,
        "SANDPIT_VAR_DIR": str(log_path.parent / "var"),
        "SANDPIT_LOG_LEVEL": "WARNING",
        **extra_env,
    }
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with log_path.open("w") as log:
        process = server_start(port, env, log, module=module)
        try:
            deadline = time.monotonic() + 30
            while not _answers(base):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("server did not start: " + log_path.read_text()[-2000:])
                time.sleep(0.1)
            yield base, Path(local_root)
        finally:
            server_stop(process)
            shutil.rmtree(local_root, ignore_errors=True)


def _answers(base: str) -> bool:
    try:
        return httpx.get(f"{base}/health/live", timeout=1).status_code == 200
    except httpx.TransportError:
        return False
