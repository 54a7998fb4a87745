"""Several web server processes on one port (playground/webprocs.py): every process answers,
new connections spread over them, they stop together, and how many the default (auto)
runs where."""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from playground.webprocs import cores, planned_processes
from tests.requirements import missing_part
from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[2]


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(p) for p in (task / "children").read_text().split()]
    return found


def serving_pid(server_port: int, client_port: int, pids: list[int]) -> int:
    """The process holding the server side of the TCP connection from `client_port`."""
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = fields[1], fields[2]
        if int(local.split(":")[1], 16) == server_port and int(remote.split(":")[1], 16) == (
            client_port
        ):
            inode = fields[9]
    assert inode is not None, f"no server socket for client port {client_port}"
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                if os.readlink(fd) == f"socket:[{inode}]":
                    return pid
            except OSError:
                continue
    raise AssertionError(f"no process of {pids} holds socket {inode}")


def start(port: int, env: dict[str, str], *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "playground.webserver", "-b", "127.0.0.1", "-p", str(port)]
        + list(extra)
        + ["playground.asgi:application"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def wait_ready(proc: subprocess.Popen[bytes], port: int, processes: int) -> list[int]:
    """Wait until every process holds its listening socket; returns their pids. (The
    sockets listen from the start; a first request waits for its process's start-up.)"""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:] if proc.stderr else ""
        pids = children(proc.pid)
        listening = [pid for pid in pids if _listens(pid, port)]
        if len(listening) == processes:
            return listening
        time.sleep(0.2)
    raise AssertionError("the web processes did not all start listening")


def _listens(pid: int, port: int) -> bool:
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and int(fields[1].split(":")[1], 16) == port:  # LISTEN
            inodes.add(f"socket:[{fields[9]}]")
    try:
        return any(os.readlink(fd) in inodes for fd in Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    if not os.environ.get("REDIS_URL"):
        missing_part("several web processes need Redis (REDIS_URL)")
    return {**os.environ, "DJANGO_SETTINGS_MODULE": "playground.settings"}


@pytest.fixture(scope="module")
def two_processes(env: dict[str, str]) -> Iterator[tuple[subprocess.Popen[bytes], int, list[int]]]:
    port = free_port()
    proc = start(port, env, "--processes", "2")
    try:
        yield proc, port, wait_ready(proc, port, 2)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(30)


def test_both_processes_answer_and_connections_spread(two_processes) -> None:  # type: ignore[no-untyped-def]
    proc, port, pids = two_processes
    connections = [http.client.HTTPConnection("127.0.0.1", port, timeout=30) for _ in range(24)]
    served: dict[int, int] = {}
    try:
        for conn in connections:
            conn.request("GET", "/health/live")
            response = conn.getresponse()
            response.read()
            assert response.status == 200
            pid = serving_pid(port, conn.sock.getsockname()[1], pids)
            served[pid] = served.get(pid, 0) + 1
    finally:
        for conn in connections:
            conn.close()
    # SO_REUSEPORT hashes each connection to one socket: 24 all on one side has odds 2^-23.
    assert set(served) == set(pids), served


def test_each_server_knows_how_many_share_the_machine(two_processes) -> None:  # type: ignore[no-untyped-def]
    _, _, pids = two_processes
    for pid in pids:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert b"SANDPIT_WEB_PROCESS_COUNT=2" in environ


@pytest.mark.parametrize(("count", "pool_max"), [(1, 20), (2, 20), (4, 10), (16, 5)])
def test_the_database_pool_default_is_a_share_of_the_machines(env, count, pool_max) -> None:  # type: ignore[no-untyped-def]
    child = {k: v for k, v in env.items() if k != "DJANGO_DB_POOL_MAX"}
    child.update(
        SANDPIT_WEB_PROCESS_COUNT=str(count),
        DATABASE_URL="postgres://postgres@127.0.0.1:5432/unused",
    )
    code = "from django.conf import settings as s; print(s.DATABASES['default']['OPTIONS']['pool']['max_size'])"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=child,
        capture_output=True,
        text=True,
        check=True,
    )
    assert int(out.stdout) == pool_max


def test_they_stop_together(two_processes) -> None:  # type: ignore[no-untyped-def]
    """Last of the tests sharing the servers: it stops them."""
    proc, port, pids = two_processes
    os.kill(pids[0], signal.SIGTERM)  # one process ends: the supervisor stops the other
    proc.wait(30)
    for pid in pids:
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not Path(f"/proc/{pid}").exists()


def test_several_processes_need_redis(env: dict[str, str]) -> None:
    without = {k: v for k, v in env.items() if k != "REDIS_URL"}
    proc = start(free_port(), without, "--processes", "2")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert b"needs REDIS_URL" in err


def test_auto_serves_one_per_core_with_redis_and_they_die_with_the_supervisor(  # type: ignore[no-untyped-def]
    env,
):
    """The default (SANDPIT_WEB_PROCESSES unset: auto) with Redis; a supervisor killed
    outright (no chance to stop them) takes its servers along."""
    auto = {k: v for k, v in env.items() if k != "SANDPIT_WEB_PROCESSES"}
    auto["SANDPIT_PROVIDERS"] = "local,docker"
    port = free_port()
    proc = start(port, auto)
    try:
        pids = wait_ready(proc, port, cores())
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    for pid in pids:
        deadline = time.monotonic() + 20
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not Path(f"/proc/{pid}").exists(), f"server {pid} outlived its supervisor"


@pytest.mark.parametrize(
    ("requested", "redis", "providers", "expected", "note"),
    [
        ("auto", True, ["local", "docker"], "cores", None),
        ("auto", False, ["local"], 1, "one web process (without REDIS_URL"),
        ("auto", True, ["local", "e2b"], 1, "one web process: e2b terminals"),
        ("0", True, ["local", "docker"], "cores", None),
        ("3", True, ["local", "e2b"], 3, "warning: e2b terminals"),
        ("1", False, ["local"], 1, None),
    ],
)
def test_planned_processes(requested, redis, providers, expected, note, settings) -> None:  # type: ignore[no-untyped-def]
    settings.CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels_redis.core.RedisChannelLayer"}
        if redis
        else {"BACKEND": "channels.layers.InMemoryChannelLayer"}
    }
    settings.SANDPIT_PROVIDERS = providers
    count, said = planned_processes(requested)
    assert count == (cores() if expected == "cores" else expected)
    assert (said is None) if note is None else (said is not None and said.startswith(note))


def test_more_than_one_without_redis_is_refused(settings) -> None:  # type: ignore[no-untyped-def]
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    with pytest.raises(SystemExit, match="needs REDIS_URL"):
        planned_processes("2")
    with pytest.raises(SystemExit, match="'auto' or a number"):
        planned_processes("many")
