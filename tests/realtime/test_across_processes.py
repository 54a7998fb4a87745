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
from tests.servers import free_port

from .conftest import (
    ROOT,
    WEBSERVER,
    Api,
    Server,
    TerminalOutput,
    _database_url_for,
    recv_json,
)

pytestmark = pytest.mark.django_db(transaction=True)


class Launcher:
    def __init__(self, root: Path, logs: Path, database_url: str) -> None:
        self.root = root
        self.logs = logs
        self.database_url = database_url
        self.procs: list[subprocess.Popen[bytes]] = []

    def spawn(self, name: str) -> tuple[Server, subprocess.Popen[bytes]]:
        """Start a daphne; `ready` waits for it (two start side by side)."""
        port = free_port()
        log = self.logs / f"{name}-{port}.log"
        env = {
            **os.environ,
            "DATABASE_URL": self.database_url,
            "SANDPIT_LOCAL_ROOT": str(self.root),
            "SANDPIT_PROVIDERS": os.environ.get("SANDPIT_PROVIDERS", "local"),
            "SANDPIT_DEFAULT_PROVIDER": "local",
            "SANDPIT_INSTALLATION": "pytest-across",
            # One daphne each: "A dies" is one process dying.
            "SANDPIT_WEB_PROCESSES": "1",
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
        return Server(port=port, root=self.root, log=log, pid=proc.pid), proc

    def ready(self, server: Server, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(server.http + "/health/live", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail("daphne did not start:\n" + server.log.read_text()[-3000:])
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
def spawned_b(launcher: Launcher) -> tuple[Server, subprocess.Popen[bytes]]:
    return launcher.spawn("b")


@pytest.fixture
def server_b(spawned_b, server_a) -> Server:  # type: ignore[no-untyped-def]
    return spawned_b[0]


@pytest.fixture
def server_a(launcher: Launcher, spawned_b, transactional_db) -> Iterator[Any]:  # type: ignore[no-untyped-def]
    server, proc = launcher.spawn("a")  # boots while B does (the first time)
    launcher.ready(*spawned_b)
    launcher.ready(server, proc)
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


def _until(ws: Any, predicate: Any, timeout: float = 15.0) -> list[dict[str, Any]]:
    """JSON messages until one satisfies `predicate` (all of them returned)."""
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"timed out; got {seen}")
        frame = ws.recv(timeout=remaining)
        if isinstance(frame, str):
            seen.append(json.loads(frame))
            if predicate(seen[-1]):
                return seen


def _touched(path: str) -> Any:
    return lambda m: m["type"] == "files" and any(e["path"] == path for e in m["events"])


class Scenario:
    """One sandbox, reached through process A (killed halfway) and process B."""

    def __init__(self, a: Server, b: Server, key: str, sandbox_id: str) -> None:
        self.a, self.b, self.key, self.sandbox_id = a, b, key, sandbox_id
        self.api_a, self.api_b = Api(a, key), Api(b, key)
        self.base = f"/api/v1/sandboxes/{sandbox_id}"

    def put(self, path: str) -> None:
        response = self.api_b.put(f"{self.base}/files/content?path={path}", content=b"x")
        assert response.status_code in (200, 201), response.text

    # -- before A dies -----------------------------------------------------------------

    def terminal_before(self, other_key: str) -> None:
        made = self.api_a.post(f"{self.base}/terminals", json={})
        assert made.status_code == 201, made.text
        self.terminal = terminal = made.json()
        # Any process lists it.
        listed = self.api_b.get(f"{self.base}/terminals").json()["results"]
        assert [t["id"] for t in listed] == [terminal["id"]]
        self.term_a = TerminalOutput(self.a.ws(terminal["ws_path"], key=self.key))
        self.term_b = TerminalOutput(self.b.ws(terminal["ws_path"], key=self.key))
        self.term_a.read_until(r"\$ ")
        self.term_b.read_until(r"\$ ")
        # Typed through A, seen through both; typed through B, seen through both.
        self.term_a.send("echo from-a-$((40+2))\r")
        self.term_a.read_until(r"from-a-42\r\n")
        self.term_b.read_until(r"from-a-42\r\n")
        self.term_b.send("echo from-b-$((50+1)); MARK=kept-$((2*3))\r")
        self.term_a.read_until(r"from-b-51\r\n")
        self.term_b.read_until(r"from-b-51\r\n")
        detail = self.api_b.get(f"{self.base}/terminals/{terminal['id']}")
        assert detail.status_code == 200 and detail.json()["clients"] == 2, detail.text
        # Another organization cannot reach it through either process.
        with self.b.ws(terminal["ws_path"], key=other_key) as other:
            assert json.loads(other.recv(timeout=10))["type"] == "error"
            with pytest.raises(ConnectionClosed) as closed:
                other.recv(timeout=10)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 4404

    def run_and_watch_before(self) -> None:
        self.events_a = self.a.ws(f"/ws/sandboxes/{self.sandbox_id}/events", key=self.key)
        recv_json(self.events_a, "ready")
        self.events_a.send(json.dumps({"type": "watch", "path": ".", "debounce_ms": 0}))
        self.watching = recv_json(self.events_a, "watching")
        assert self.watching["session"].startswith("watch_")
        self.exec_a = self.a.ws(f"/ws/sandboxes/{self.sandbox_id}/exec", key=self.key)
        script = (
            "echo first; read go; for i in 1 2 3; do echo line-$i; done; "
            "read x; echo got-$x; echo oops >&2; exit 5"
        )
        self.exec_a.send(json.dumps({"type": "run", "id": "r1", "command": script}))
        self.started = recv_json(self.exec_a, "started")
        assert self.started["session"].startswith("run_")
        first = recv_json(self.exec_a, "stdout")
        assert first["data"] == "first\n" and first["offset"] == 6
        self.put("before.txt")
        self.watch_offset = _until(self.events_a, _touched("before.txt"))[-1]["offset"]

    # -- after A died --------------------------------------------------------------------

    def a_is_gone(self) -> None:
        with pytest.raises((ConnectionClosed, TimeoutError, OSError)):
            while True:
                self.term_a.ws.recv(timeout=10)
        # While nobody listens to the watch, it records.
        self.put("during-1.txt")
        self.put("during-2.txt")

    def terminal_after(self) -> None:
        terminal = self.terminal
        self.term_b.send("echo b-after-$((6*7)) $MARK\r")
        self.term_b.read_until(r"b-after-42 kept-6\r\n")
        self.term_b.ws.close()
        # A new socket on B: the scrollback (A's and B's lines), then the same shell.
        again = TerminalOutput(self.b.ws(terminal["ws_path"], key=self.key))
        again.read_until(r"(?s)from-a-42\r\n.*from-b-51\r\n.*b-after-42 kept-6\r\n")
        again.send("echo $MARK-again\r")
        again.read_until(r"kept-6-again\r\n")
        # B resizes and kills it; its socket gets the exit.
        resized = self.api_b.post(
            f"{self.base}/terminals/{terminal['id']}/resize", json={"cols": 100, "rows": 33}
        )
        assert resized.status_code == 200 and resized.json()["cols"] == 100, resized.text
        again.send("stty size\r")
        again.read_until(r"33 100\r\n")
        gone = self.api_b.delete(f"{self.base}/terminals/{terminal['id']}")
        assert gone.status_code == 204, gone.text
        assert again.wait_control("exit")["code"] == -9
        assert self.api_b.get(f"{self.base}/terminals").json()["results"] == []

    def run_after(self) -> None:
        exec_b = self.b.ws(f"/ws/sandboxes/{self.sandbox_id}/exec", key=self.key)
        exec_b.send(json.dumps({"type": "attach", "id": "r1", "session": "run_" + "0" * 16}))
        assert recv_json(exec_b, "error")["code"] == "run_not_found"
        # From where A's client got to (no "first" again), then live, with stdin from B.
        session = self.started["session"]
        exec_b.send(json.dumps({"type": "attach", "id": "r1", "session": session, "since": 6}))
        assert recv_json(exec_b, "started")["pid"] == self.started["pid"]
        exec_b.send(json.dumps({"type": "stdin", "id": "r1", "data": "go\n"}))
        exec_b.send(json.dumps({"type": "stdin", "id": "r1", "data": "hello\n"}))
        messages = _until(exec_b, lambda m: m["type"] == "exit")
        out = "".join(m["data"] for m in messages if m["type"] == "stdout")
        assert out == "line-1\nline-2\nline-3\ngot-hello\n"
        assert [m["data"] for m in messages if m["type"] == "stderr"] == ["oops\n"]
        assert messages[-1]["code"] == 5
        exec_b.close()

    def watch_after(self) -> None:
        events_b = self.b.ws(f"/ws/sandboxes/{self.sandbox_id}/events", key=self.key)
        recv_json(events_b, "ready")
        resume = {"resume": self.watching["session"], "since": self.watch_offset}
        events_b.send(json.dumps({"type": "watch", "debounce_ms": 0, **resume}))
        assert recv_json(events_b, "watching")["session"] == self.watching["session"]
        # What happened while no one listened, after A's client's offset; then live.
        paths: set[str] = set()
        deadline = time.monotonic() + 15
        while not {"during-1.txt", "during-2.txt"} <= paths:
            message = recv_json(events_b, "files", timeout=deadline - time.monotonic())
            paths |= {e["path"] for e in message["events"]}
        assert "before.txt" not in paths
        self.put("live.txt")
        _until(events_b, _touched("live.txt"))
        events_b.close()


@pytest.mark.parametrize("provider", PROVIDERS)
def test_terminals_runs_and_watches_outlive_the_process_that_started_them(  # type: ignore[no-untyped-def]
    server_a, server_b, key_a, key_b, provider
):
    _provider_or_skip(provider)
    a, proc_a = server_a
    sandbox_id = _sandbox(Api(a, key_a), provider)
    scenario = Scenario(a, server_b, key_a, sandbox_id)
    try:
        scenario.terminal_before(other_key=key_b)
        scenario.run_and_watch_before()
        _kill(proc_a)
        scenario.a_is_gone()
        scenario.terminal_after()
        scenario.run_after()
        scenario.watch_after()
    finally:
        scenario.api_b.delete(f"/api/v1/sandboxes/{sandbox_id}")
