"""Two web processes (daphne on two ports, one PostgreSQL, one Redis): terminals, streamed
runs and file watches started through one are reached through the other, and survive
the first one's death (SIGKILL), because they live in the sandbox's agent.

Process B lives for the module; process A is started per test and killed in it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed

from tests.requirements import jail_root

from .conftest import (
    ROOT,
    WEBSERVER,
    Api,
    Server,
    TerminalOutput,
    _database_url_for,
    free_port,
)

pytestmark = pytest.mark.django_db(transaction=True)


class Launcher:
    def __init__(self, root: Path, logs: Path, database_url: str) -> None:
        self.root = root
        self.logs = logs
        self.database_url = database_url
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str) -> tuple[Server, subprocess.Popen[bytes]]:
        port = free_port()
        log = self.logs / f"{name}-{port}.log"
        env = {
            **os.environ,
            "DATABASE_URL": self.database_url,
            "SANDPIT_LOCAL_ROOT": str(self.root),
            "SANDPIT_PROVIDERS": os.environ.get("SANDPIT_PROVIDERS", "local"),
            "SANDPIT_DEFAULT_PROVIDER": "local",
            "SANDPIT_INSTALLATION": "pytest-across",
            "SANDPIT_PREVIEW_DOMAIN": "",
            "DJANGO_SETTINGS_MODULE": "playground.settings",
            "PYTHONPATH": str(ROOT),
        }
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [*WEBSERVER, "-b", "127.0.0.1", "-p", str(port), "playground.asgi:application"],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.procs.append(proc)
        server = Server(port=port, root=self.root, log=log, pid=proc.pid)
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(server.http + "/health/live", timeout=2).status_code == 200:
                    return server, proc
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"daphne {name} did not start:\n" + log.read_text()[-3000:])
            time.sleep(0.1)

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


@pytest.fixture(scope="module")
def launcher(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[Launcher]:  # type: ignore[no-untyped-def]
    from django.db import connection

    launcher = Launcher(
        jail_root("across-sandboxes"),
        tmp_path_factory.mktemp("across-logs"),
        _database_url_for(connection.settings_dict["NAME"]),
    )
    yield launcher
    launcher.stop_all()
    from sandboxes.providers.local import LocalProvider

    provider = LocalProvider(root_dir=launcher.root)
    for handle in provider.list_sandboxes():
        provider.destroy(handle.provider_id)


@pytest.fixture(scope="module")
def server_b(launcher: Launcher) -> Server:
    return launcher.start("b")[0]


@pytest.fixture
def server_a(launcher: Launcher, server_b: Server, transactional_db) -> Iterator[Any]:  # type: ignore[no-untyped-def]
    server, proc = launcher.start("a")
    yield server, proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """What a crash looks like: no shutdown, no goodbye to anything."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)


def _sandbox(api: Api, provider: str) -> str:
    response = api.post("/api/v1/sandboxes", json={"provider": provider})
    assert response.status_code == 201, response.text
    return response.json()["id"]


PROVIDERS = ["local", "docker"]


def _provider_or_skip(provider: str) -> None:
    if provider == "docker":
        from tests.docker_support import docker_provider_or_skip

        docker_provider_or_skip()


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_terminal_is_shared_by_two_processes_and_outlives_its_creator(  # type: ignore[no-untyped-def]
    server_a, server_b, key_a, key_b, provider
):
    _provider_or_skip(provider)
    a, proc_a = server_a
    api_a, api_b = Api(a, key_a), Api(server_b, key_a)
    sandbox_id = _sandbox(api_a, provider)
    try:
        made = api_a.post(f"/api/v1/sandboxes/{sandbox_id}/terminals", json={})
        assert made.status_code == 201, made.text
        terminal = made.json()
        # Any process lists it and describes it.
        listed = api_b.get(f"/api/v1/sandboxes/{sandbox_id}/terminals").json()["results"]
        assert [t["id"] for t in listed] == [terminal["id"]]
        via_a = TerminalOutput(a.ws(terminal["ws_path"], key=key_a))
        via_b = TerminalOutput(server_b.ws(terminal["ws_path"], key=key_a))
        via_a.read_until(r"\$ ")
        via_b.read_until(r"\$ ")
        # Typed through A, seen through both; typed through B, seen through both.
        via_a.send("echo from-a-$((40+2))\r")
        via_a.read_until(r"from-a-42\r\n")
        via_b.read_until(r"from-a-42\r\n")
        via_b.send("echo from-b-$((50+1)); MARK=kept-$((2*3))\r")
        via_a.read_until(r"from-b-51\r\n")
        via_b.read_until(r"from-b-51\r\n")
        detail = api_b.get(f"/api/v1/sandboxes/{sandbox_id}/terminals/{terminal['id']}")
        assert detail.status_code == 200 and detail.json()["clients"] == 2, detail.text
        # Another organization cannot reach it through either process.
        with server_b.ws(terminal["ws_path"], key=key_b) as other:
            assert json.loads(other.recv(timeout=10))["type"] == "error"
            with pytest.raises(ConnectionClosed) as closed:
                other.recv(timeout=10)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 4404

        _kill(proc_a)
        # A's socket ends with A; the shell does not.
        with pytest.raises((ConnectionClosed, TimeoutError, OSError)):
            while True:
                via_a.ws.recv(timeout=10)
        via_b.send("echo b-after-$((6*7)) $MARK\r")
        via_b.read_until(r"b-after-42 kept-6\r\n")
        via_b.ws.close()
        # A new socket on B: the scrollback (A's and B's lines), then the same shell.
        again = TerminalOutput(server_b.ws(terminal["ws_path"], key=key_a))
        again.read_until(r"(?s)from-a-42\r\n.*from-b-51\r\n.*b-after-42 kept-6\r\n")
        again.send("echo $MARK-again\r")
        again.read_until(r"kept-6-again\r\n")
        # B resizes and kills it; its socket gets the exit.
        resized = api_b.post(
            f"/api/v1/sandboxes/{sandbox_id}/terminals/{terminal['id']}/resize",
            json={"cols": 100, "rows": 33},
        )
        assert resized.status_code == 200 and resized.json()["cols"] == 100, resized.text
        again.send("stty size\r")
        again.read_until(r"33 100\r\n")
        gone = api_b.delete(f"/api/v1/sandboxes/{sandbox_id}/terminals/{terminal['id']}")
        assert gone.status_code == 204, gone.text
        assert again.wait_control("exit")["code"] == -9
        assert api_b.get(f"/api/v1/sandboxes/{sandbox_id}/terminals").json()["results"] == []
    finally:
        api_b.delete(f"/api/v1/sandboxes/{sandbox_id}")
