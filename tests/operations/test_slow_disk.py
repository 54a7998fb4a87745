"""The README's run command (SQLite, in-memory layer, filesystem broker, local provider) with
its var directory on a slow disk (tests/slow_disk.py: every write and sync waits).

The web server, the embedded worker and beat then queue on SQLite's one write lock, held
for seconds at a time. What must hold: every request is answered, either as it would be
on a fast disk or with a 503 `database_unavailable` in the one error shape that says to
retry (never a 500 and its traceback); an operation that ran is counted once, even when
its usage record met the locked database; and the server keeps answering its health
probe throughout."""

from __future__ import annotations

import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from sandboxes.providers.local import volume
from tests.requirements import jail_root
from tests.servers import embedded_env, free_port, jails_destroyed, make_run, manage
from tests.slow_disk import slow_disk

ROOT = Path(__file__).resolve().parents[2]
PYTHON = str(ROOT / ".venv/bin/python")

WRITE_DELAY_MS = 150
"""Each write and sync: a SQLite commit (journal, data, syncs, the journal's removal) then
takes over a second, and a handful of concurrent writers wait past SQLite's busy timeout."""
CLIENTS = 6
LOAD_S = 40.0
BUSY_TIMEOUT_S = "4"
"""SQLite's busy timeout (SANDPIT_SQLITE_BUSY_TIMEOUT_S) for this server: short, so that the
load reaches it within the test's time."""


def _embedded_env(var: Path, jails: Path, port: int) -> dict[str, str]:
    return embedded_env(
        var,
        jails,
        SANDPIT_LOCAL_ROOT_IN_MEMORY="true",
        SANDPIT_PORT=str(port),
        SANDPIT_API_RATE="1000000/min",
        SANDPIT_SQLITE_BUSY_TIMEOUT_S=BUSY_TIMEOUT_S,
    )


def _wait_until_listening(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health/live", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError("make run did not serve: " + log.read_text()[-3000:])


class Load:
    """Clients running metered operations on one sandbox until told to stop, each answer
    kept (status, body, Retry-After)."""

    def __init__(self, api: httpx.Client, sandbox_id: str) -> None:
        self.api = api
        self.sandbox_id = sandbox_id
        self.stop = threading.Event()
        self.answers: list[tuple[str, int, Any, str | None]] = []
        self.lock = threading.Lock()

    def operations(self, number: int) -> None:
        base = f"/api/v1/sandboxes/{self.sandbox_id}"
        turn = 0
        while not self.stop.is_set():
            turn += 1
            if turn % 3 == 1:
                what = "write"
                response = self.api.put(
                    f"{base}/files/content",
                    params={"path": f"client-{number}.txt"},
                    content=f"turn {turn}".encode(),
                )
            elif turn % 3 == 2:
                what = "command"
                response = self.api.post(f"{base}/commands", json={"command": f"echo {turn}"})
            else:
                what = "read"
                response = self.api.get(
                    f"{base}/files/content", params={"path": f"client-{number}.txt"}
                )
            try:
                body = response.json() if what != "read" or response.status_code != 200 else None
            except ValueError:
                body = response.text[:300]
            with self.lock:
                self.answers.append(
                    (what, response.status_code, body, response.headers.get("Retry-After"))
                )

    def client(self, number: int) -> None:
        try:
            self.operations(number)
        except httpx.HTTPError as exc:  # the server went away: the test says so, with its log
            with self.lock:
                self.answers.append(("connection", 0, repr(exc), None))


def test_run_command_on_a_slow_disk_answers_every_request_and_counts_each_once(tmp_path):
    port = free_port()
    jails = jail_root("slow-disk")
    log = tmp_path / "run.log"
    with slow_disk(tmp_path / "disk") as disk:
        var = disk.mount / "var"
        env = _embedded_env(var, jails, port)
        # Prepared at full speed, through the backing directory: the same files.
        fast_env = _embedded_env(disk.backing / "var", jails, port)
        (disk.backing / "var").mkdir()
        manage(fast_env, "migrate", "--noinput")
        manage(fast_env, "ensure_demo")
        secret = manage(fast_env, "create_api_key", "demo", "slow-disk")
        try:
            with make_run(env, log) as proc:
                _wait_until_listening(port, proc, log)
                api = httpx.Client(
                    base_url=f"http://127.0.0.1:{port}",
                    headers={"Authorization": f"Bearer {secret}"},
                    timeout=120,
                )
                created = api.post("/api/v1/sandboxes", json={})
                assert created.status_code == 201, created.text
                sandbox_id = created.json()["id"]
                usage_before = api.get("/api/v1/usage").json()["executions"]

                disk.set_delay_ms(WRITE_DELAY_MS)
                load = Load(api, sandbox_id)
                clients = [
                    threading.Thread(target=load.client, args=(n,), daemon=True)
                    for n in range(CLIENTS)
                ]
                for thread in clients:
                    thread.start()
                probes: list[int | str] = []
                started = time.monotonic()
                while time.monotonic() - started < LOAD_S:
                    try:
                        probes.append(
                            httpx.get(
                                f"http://127.0.0.1:{port}/health/live", timeout=10
                            ).status_code
                        )
                    except httpx.HTTPError as exc:
                        probes.append(type(exc).__name__)
                    time.sleep(0.25)
                load.stop.set()
                for thread in clients:
                    thread.join(180)
                    assert not thread.is_alive(), "a client never got its answer"
                disk.set_delay_ms(0)
                # `make run` stops everything when one of its processes exits.
                assert proc.poll() is None, log.read_text()[-6000:]

                statuses = Counter(status for _, status, _, _ in load.answers)
                assert set(statuses) <= {200, 201, 503}, (statuses, _first_failures(load))
                succeeded = [what for what, status, _, _ in load.answers if status in (200, 201)]
                assert len(succeeded) >= CLIENTS, statuses  # the product did work on that disk
                # The load met the lock where it matters most: after operations that ran.
                assert "usage record kept on disk" in log.read_text(), statuses
                for _, status, body, retry_after in load.answers:
                    if status == 503:
                        assert body["error"]["code"] == "database_unavailable", body
                        assert retry_after is not None and int(retry_after) >= 1
                assert set(probes) == {200}, Counter(probes)

                # Every operation that answered 2xx is counted, once; none that answered 503 is:
                # at once (records kept on disk count as pending), and after they are flushed.
                counted = api.get("/api/v1/usage").json()["executions"] - usage_before
                assert counted == len(succeeded), (counted, statuses)
                manage(env, "billing_flush")
                assert not list((disk.backing / "var/usage-spool").glob("*.json"))
                counted = api.get("/api/v1/usage").json()["executions"] - usage_before
                assert counted == len(succeeded), (counted, statuses)
                sandbox = api.get(f"/api/v1/sandboxes/{sandbox_id}").json()
                assert sandbox["state"] == "running", sandbox
                assert api.delete(f"/api/v1/sandboxes/{sandbox_id}").status_code == 200
                output = log.read_text()
                assert "Traceback" not in output, output[output.index("Traceback") - 500 :][:4000]
        finally:
            jails_destroyed(jails)
            volume.release_root(jails)


def _first_failures(load: Load) -> list[Any]:
    return [answer for answer in load.answers if answer[1] not in (200, 201, 503)][:3]
