"""A real daphne on loopback, sharing the test database, with the local provider."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
from websockets.sync.client import ClientConnection, connect

from tests.requirements import jail_root, missing_part
from tests.servers import free_port, server_start

ROOT = Path(__file__).resolve().parents[2]
# The production launcher: daphne with the request-body ceiling (playground/webserver.py).
WEBSERVER = [sys.executable, "-m", "playground.webserver"]
SERVER_INSTALLATION = f"pytest-realtime-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
"""The test server's installation name, which its meter keys in Redis carry: one per xdist
worker, whose test databases give organizations the same ids."""


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix):  # type: ignore[no-untyped-def]
    """Own test database name, so parallel runs of other suites do not drop ours."""
    from django.conf import settings

    test = settings.DATABASES["default"].setdefault("TEST", {})
    if not test.get("NAME"):
        test["NAME"] = "test_" + settings.DATABASES["default"]["NAME"] + "_realtime"


@dataclass
class Server:
    port: int
    root: Path
    log: Path
    pid: int

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ws(
        self,
        path: str,
        *,
        key: str | None = None,
        origin: str | None = None,
        headers: dict[str, str] | None = None,
        ping_interval: float | None = 20,
    ) -> ClientConnection:
        """`ping_interval`: the client's keepalive (websockets' default); None for none."""
        extra = dict(headers or {})
        if key:
            extra["Authorization"] = f"Bearer {key}"
        return connect(
            f"ws://127.0.0.1:{self.port}{path}",
            origin=origin or self.origin,  # type: ignore[arg-type]
            additional_headers=extra,
            open_timeout=10,
            max_size=None,
            ping_interval=ping_interval,
        )


def _database_url_for(name: str) -> str:
    url = os.environ.get("DATABASE_URL", "")
    if not url:
        missing_part("the real-time tests need DATABASE_URL (PostgreSQL) shared with daphne")
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


@pytest.fixture(scope="session")
def daphne_server(django_db_setup, django_db_blocker, tmp_path_factory):  # type: ignore[no-untyped-def]
    from django.db import connection

    root = jail_root("rt-sandboxes")
    log = tmp_path_factory.mktemp("rt-logs") / "daphne.log"
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": _database_url_for(connection.settings_dict["NAME"]),
        "SANDPIT_LOCAL_ROOT": str(root),
        "SANDPIT_SNAPSHOT_DIR": str(tmp_path_factory.mktemp("rt-snapshots")),
        "SANDPIT_PROVIDERS": os.environ.get("SANDPIT_PROVIDERS", "local"),
        "SANDPIT_DEFAULT_PROVIDER": "local",
        "SANDPIT_INSTALLATION": SERVER_INSTALLATION,
        # One daphne, not one per core: a test reads its memory by its pid.
        "SANDPIT_WEB_PROCESSES": "1",
        # These suites test the path form (/sandboxes/<id>/ports/<port>/); the host form is
        # tested in Chromium (tests/browser/test_preview_origin.py).
        "SANDPIT_PREVIEW_DOMAIN": "",
        "DJANGO_SETTINGS_MODULE": "playground.settings",
        "PYTHONPATH": str(ROOT),
    }
    with open(log, "wb") as out:
        # Launched as a script launches a server (SIGINT ignored, SIGCHLD blocked): what runs
        # in the sandboxes must not inherit that (tests/unfriendly_launch.py).
        proc = server_start(
            port, env, out, through=(sys.executable, "-m", "tests.unfriendly_launch")
        )
    server = Server(port=port, root=root, log=log, pid=proc.pid)
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(server.http + "/health/live", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail("daphne did not start:\n" + log.read_text()[-3000:])
        time.sleep(0.1)
    yield server
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
    from sandboxes.providers.local import LocalProvider

    provider = LocalProvider(root_dir=root)
    for handle in provider.list_sandboxes():
        provider.destroy(handle.provider_id)


@pytest.fixture
def server(daphne_server, transactional_db):  # type: ignore[no-untyped-def]
    return daphne_server


class Api:
    """httpx against daphne with an API key."""

    def __init__(self, server: Server, key: str) -> None:
        self.server = server
        self.key = key
        self.client = httpx.Client(
            base_url=server.http, headers={"Authorization": f"Bearer {key}"}, timeout=30
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


@pytest.fixture
def rt_api_a(server, key_a) -> Api:  # type: ignore[no-untyped-def]
    return Api(server, key_a)


@pytest.fixture
def rt_api_b(server, key_b) -> Api:  # type: ignore[no-untyped-def]
    return Api(server, key_b)


def create_sandbox(api: Api, provider: str = "local") -> str:
    response = api.post("/api/v1/sandboxes", json={"provider": provider})
    assert response.status_code == 201, response.text
    return response.json()["id"]


@pytest.fixture
def sbx_a(rt_api_a) -> str:  # type: ignore[no-untyped-def]
    sandbox_id = create_sandbox(rt_api_a)
    yield sandbox_id
    rt_api_a.delete(f"/api/v1/sandboxes/{sandbox_id}")


def open_terminal(api: Api, sandbox_id: str, **body: Any) -> dict[str, Any]:
    response = api.post(f"/api/v1/sandboxes/{sandbox_id}/terminals", json=body)
    assert response.status_code == 201, response.text
    return response.json()


class TerminalOutput:
    """Accumulates a terminal socket's binary frames; control frames kept apart."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.data = b""
        self.control: list[dict[str, Any]] = []

    def read_until(self, pattern: bytes | str, timeout: float = 10.0) -> bytes:
        regex = re.compile(pattern.encode() if isinstance(pattern, str) else pattern)
        deadline = time.monotonic() + timeout
        while not regex.search(self.data):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(
                    f"timed out waiting for {pattern!r}; got {self.data[-2000:]!r}"
                )
            try:
                frame = self.ws.recv(timeout=remaining)
            except TimeoutError:
                continue
            if isinstance(frame, bytes):
                self.data += frame
            else:
                self.control.append(json.loads(frame))
        return self.data

    def send(self, data: bytes | str) -> None:
        self.ws.send(data.encode() if isinstance(data, str) else data)

    def wait_control(self, kind: str, timeout: float = 10.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for message in self.control:
                if message.get("type") == kind:
                    return message
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {kind!r} message; got {self.control}")
            frame = self.ws.recv(timeout=remaining)
            if isinstance(frame, bytes):
                self.data += frame
            else:
                self.control.append(json.loads(frame))


def recv_json(ws: ClientConnection, kind: str, timeout: float = 10.0) -> dict[str, Any]:
    """The next JSON message of a type (others are skipped)."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"no {kind!r} message")
        frame = ws.recv(timeout=remaining)
        if isinstance(frame, str):
            message = json.loads(frame)
            if message.get("type") == kind:
                return message
