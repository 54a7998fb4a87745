"""Stopping the web server (SIGTERM, as a supervisor does) while it serves requests: it stops
listening, lets what it accepted finish and answers it, meters it once, and exits.

A real server (the product's launcher, started as a script starts it: SIGINT ignored) on this
test's PostgreSQL database and Redis, with the local provider. Before the fix, a destroy in
flight at the stop hung the process for good: its view, cancelled, broadcast the sandbox's new
state through an event loop that no longer ran, and the client got no answer.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis
from django.db import connection

from billing import metering
from billing.selectors import usage_summary
from sandboxes.models import Sandbox, SandboxState
from sandboxes.providers.local import LocalProvider
from tests.requirements import missing_part
from tests.servers import free_port, live_server_env, server_start

pytestmark = pytest.mark.django_db(transaction=True)


@dataclass
class Served:
    url: str
    proc: subprocess.Popen[bytes]
    root: Path
    """Its local provider's jail root."""


Launch = Callable[..., Served]


@pytest.fixture
def launch(transactional_db, settings, tmp_path) -> Iterator[Launch]:  # type: ignore[no-untyped-def]
    """Start the product's web server on this test's database."""
    if not settings.REDIS_URL or connection.vendor != "postgresql":
        missing_part("needs PostgreSQL and REDIS_URL")
    # An installation of its own: its meter's Redis keys are this test's alone (the org's
    # id comes back in later runs' databases), and are deleted afterwards.
    settings.SANDPIT_INSTALLATION = f"test-stop-{uuid.uuid4().hex[:12]}"
    meter_keys = f"{metering.key_prefix()}:*"
    # Short: the agent's Unix socket lives under it (AF_UNIX paths are limited to 107 bytes).
    local_root = tempfile.mkdtemp(prefix="sp-stop-", dir="/tmp")
    os.chmod(local_root, 0o711)  # noqa: S103 - passable by the jails' uids, not listable
    started: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []

    def start(**extra_env: str) -> Served:
        port = free_port()
        env = dict(
            live_server_env(settings.REDIS_URL, settings.SANDPIT_INSTALLATION),
            SANDPIT_PROVIDERS="local",
            SANDPIT_DEFAULT_PROVIDER="local",
            SANDPIT_WEB_PROCESSES="1",
            SANDPIT_LOCAL_ROOT=local_root,
            SANDPIT_LOCAL_WARM_POOL="0",
            SANDPIT_VAR_DIR=str(tmp_path / "var"),
            SANDPIT_LOG_LEVEL="WARNING",
            **extra_env,
        )
        log = tmp_path / f"server-{port}.log"
        logs.append(log)
        with open(log, "wb") as out:
            proc = server_start(
                port, env, out, through=(sys.executable, "-m", "tests.unfriendly_launch")
            )
        started.append(proc)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/health/live", timeout=1).status_code == 200:
                    return Served(base, proc, Path(local_root))
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail("the server did not start:\n" + log.read_text()[-3000:])
            time.sleep(0.1)

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    provider = LocalProvider(root_dir=Path(local_root))
    for handle in provider.list_sandboxes():
        provider.destroy(handle.provider_id)
    client = redis.Redis.from_url(settings.REDIS_URL)
    keys = list(client.scan_iter(match=meter_keys, count=1000))
    if keys:
        client.delete(*keys)
    client.close()


def _exits(proc: subprocess.Popen[bytes], within_s: float) -> int | None:
    try:
        return proc.wait(within_s)
    except subprocess.TimeoutExpired:
        return None


def _listening(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
    except OSError:
        return False
    return True


def test_a_command_in_flight_finishes_and_new_work_is_refused(launch, org_a, key_a) -> None:  # type: ignore[no-untyped-def]
    served = launch()
    base, proc = served.url, served.proc
    headers = {"Authorization": f"Bearer {key_a}"}
    created = httpx.post(f"{base}/api/v1/sandboxes", json={}, headers=headers, timeout=60)
    assert created.status_code == 201, created.text
    sandbox = created.json()["id"]
    answers: list[httpx.Response | BaseException] = []

    def command() -> None:
        try:
            answers.append(
                httpx.post(
                    f"{base}/api/v1/sandboxes/{sandbox}/commands",
                    json={"command": "sleep 1.5; echo finished"},
                    headers=headers,
                    timeout=60,
                )
            )
        except BaseException as exc:  # noqa: BLE001 - reported below
            answers.append(exc)

    # A keep-alive connection opened before the stop.
    kept = http.client.HTTPConnection(base.removeprefix("http://"), timeout=30)
    kept.request("GET", "/health/live")
    assert kept.getresponse().read()
    running = threading.Thread(target=command)
    running.start()
    time.sleep(0.5)  # the command runs in the sandbox now
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert not _listening(base), "a stopping server must not take new connections"
    assert proc.poll() is None, "it waits for the request it is serving"
    # New work on an open connection is refused, in the API's error shape, not started.
    kept.request(
        "POST",
        "/api/v1/sandboxes",
        body=b"{}",
        headers={**headers, "Content-Type": "application/json"},
    )
    refused = kept.getresponse()
    assert refused.status == 503
    assert refused.getheader("Retry-After") == "1"
    assert refused.getheader("Connection") == "close"
    assert json.loads(refused.read())["error"]["code"] == "server_stopping"
    kept.close()
    running.join(30)
    assert _exits(proc, 20) == 0
    (answer,) = answers
    assert isinstance(answer, httpx.Response), answer
    assert answer.status_code == 200, answer.text
    assert answer.json()["stdout"] == "finished\n"
    # The create and the command, each counted once; the refused create began nothing.
    assert usage_summary(organization=org_a).executions == 2
    assert Sandbox.objects.filter(organization=org_a).count() == 1


def test_destroys_cut_off_by_the_stop_still_finish_and_it_exits(launch, org_a, key_a) -> None:  # type: ignore[no-untyped-def]
    # No grace: daphne cancels the destroys in flight at once, as before the fix.
    served = launch(SANDPIT_WEB_STOP_GRACE_S="0")
    base, proc = served.url, served.proc
    headers = {"Authorization": f"Bearer {key_a}"}
    sandboxes = []
    with httpx.Client(headers=headers, timeout=60) as client:
        for _ in range(8):
            created = client.post(f"{base}/api/v1/sandboxes", json={})
            assert created.status_code == 201, created.text
            sandboxes.append(created.json()["id"])
    outcomes: list[int | str] = []

    def destroy(sandbox: str) -> None:
        try:
            outcomes.append(
                httpx.delete(
                    f"{base}/api/v1/sandboxes/{sandbox}", headers=headers, timeout=60
                ).status_code
            )
        except httpx.TransportError as exc:
            outcomes.append(type(exc).__name__)

    threads = [threading.Thread(target=destroy, args=(sandbox,)) for sandbox in sandboxes]
    for thread in threads:
        thread.start()
    # Stop as soon as the first destroy has begun (its row is destroyed before the provider
    # and the broadcast), while the others are in flight.
    deadline = time.monotonic() + 30
    while not Sandbox.objects.filter(id__in=sandboxes, state=SandboxState.DESTROYED).exists():
        assert time.monotonic() < deadline, "no destroy began"
        time.sleep(0.002)
    proc.send_signal(signal.SIGTERM)
    code = _exits(proc, 30)
    for thread in threads:
        thread.join(60)
    assert code == 0, "the server did not exit after SIGTERM"
    assert len(outcomes) == 8
    # Every destroy the server began, it finished: its row, its jail and its count, once each
    # (one refused at the door, once the server stopped listening, began nothing).
    destroyed = Sandbox.objects.filter(id__in=sandboxes, state=SandboxState.DESTROYED)
    assert destroyed.count() >= 1
    live = {handle.provider_id for handle in LocalProvider(root_dir=served.root).list_sandboxes()}
    assert not set(destroyed.values_list("provider_id", flat=True)) & live
    assert usage_summary(organization=org_a).executions == 8 + destroyed.count()
