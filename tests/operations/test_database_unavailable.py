"""A database that cannot serve, at every door: a web server on the embedded defaults
(SQLite) while this test holds SQLite's lock from another connection, as a slow disk or a
long writer in another process does.

Held as a write lock (RESERVED: others still read), an operation that ran still answers as
it should and is counted once (its record kept on disk until the flush moves it into the
ledger); a create, whose first step is a write, is 503 `database_unavailable` with
Retry-After and makes nothing. Held exclusively (nobody reads), every door answers 503 in
its own shape: the REST API, the E2B-compatible control plane and its Connect RPCs, and the
HTML pages. Never a 500, never a traceback in the log."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from sandboxes.providers.local import volume
from tests.requirements import jail_root
from tests.servers import (
    embedded_env,
    free_port,
    jails_destroyed,
    manage,
    server_start,
    server_stop,
    wait_until_serving,
)

ROOT = Path(__file__).resolve().parents[2]
PYTHON = str(ROOT / ".venv/bin/python")


class EmbeddedServer:
    def __init__(self, base: str, env: dict[str, str], database: Path, log: Path, key: str):
        self.base = base
        self.env = env
        self.database = database
        self.log = log
        self.api = httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=60
        )
        self.key = key
        self.log_checked_to = 0

    def manage(self, *args: str) -> str:
        return manage(self.env, *args)

    @contextmanager
    def locked(self, mode: str) -> Iterator[None]:
        """SQLite's lock taken by another connection: IMMEDIATE (writes wait, reads go on) or
        EXCLUSIVE (both wait)."""
        holder = sqlite3.connect(self.database, timeout=10, isolation_level=None)
        holder.execute(f"BEGIN {mode}")
        if mode == "EXCLUSIVE":
            holder.execute("DELETE FROM django_session WHERE 0")  # the lock is taken on a write
        try:
            yield
        finally:
            holder.execute("ROLLBACK")
            holder.close()

    def new_log(self) -> str:
        text = self.log.read_text()
        new, self.log_checked_to = text[self.log_checked_to :], len(text)
        return new

    def ledger_rows(self) -> int:
        with sqlite3.connect(self.database) as reader:
            return int(reader.execute("SELECT count(*) FROM billing_usageevent").fetchone()[0])

    def usage(self) -> int:
        return int(self.api.get("/api/v1/usage").json()["executions"])


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    directory = tmp_path_factory.mktemp("database-unavailable")
    var = directory / "var"
    var.mkdir()
    jails = jail_root("db-unavailable")
    env = embedded_env(
        var,
        jails,
        DJANGO_SETTINGS_MODULE="playground.settings",
        SANDPIT_API_RATE="1000000/min",
        SANDPIT_SQLITE_BUSY_TIMEOUT_S="1",
    )
    manage(env, "migrate", "--noinput")
    manage(env, "ensure_demo")
    key = manage(env, "create_api_key", "demo", "locked")
    port = free_port()
    log = directory / "server.log"
    with log.open("wb") as out:
        process = server_start(port, env, out)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(base, process, log)
        yield EmbeddedServer(base, env, var / "db.sqlite3", log, key)
    finally:
        server_stop(process)
        jails_destroyed(jails)
        volume.release_root(jails)


def _assert_unavailable(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 503, (response.status_code, response.text[:500])
    assert response.headers["Retry-After"] == "1"
    body: dict[str, Any] = response.json()
    assert body["error"]["code"] == "database_unavailable", body
    assert "retry" in body["error"]["message"]
    return body


def test_an_operation_that_ran_under_a_write_lock_answers_and_is_counted_once(embedded):  # type: ignore[no-untyped-def]
    sandbox = embedded.api.post("/api/v1/sandboxes", json={})
    assert sandbox.status_code == 201, sandbox.text
    sandbox_id = sandbox.json()["id"]
    before = embedded.usage()
    embedded.new_log()
    with embedded.locked("IMMEDIATE"):
        ran = embedded.api.post(
            f"/api/v1/sandboxes/{sandbox_id}/commands", json={"command": "echo ran"}
        )
        assert ran.status_code == 200, ran.text
        assert ran.json()["stdout"] == "ran\n"
        wrote = embedded.api.put(
            f"/api/v1/sandboxes/{sandbox_id}/files/content",
            params={"path": "kept.txt"},
            content=b"kept",
        )
        assert wrote.status_code == 201, wrote.text
        # Counted while the database still refuses them: read from the records on disk.
        assert embedded.usage() == before + 2
        spooled = list((embedded.database.parent / "usage-spool").glob("*.json"))
        assert len(spooled) == 2, spooled
        # The first step of a create is a write: refused before anything is made.
        refused = embedded.api.post("/api/v1/sandboxes", json={})
        _assert_unavailable(refused)
    log = embedded.new_log()
    assert log.count("usage record kept on disk") == 2, log
    assert "Traceback" not in log, log

    assert embedded.usage() == before + 2
    ledger_before = embedded.ledger_rows()
    embedded.manage("billing_flush")
    assert embedded.ledger_rows() == ledger_before + 2
    assert not list((embedded.database.parent / "usage-spool").glob("*.json"))
    assert embedded.usage() == before + 2  # in the ledger now, not counted twice
    listed = embedded.api.get("/api/v1/sandboxes").json()["results"]
    assert [s["id"] for s in listed if s["state"] == "running"] == [sandbox_id]
    assert embedded.api.delete(f"/api/v1/sandboxes/{sandbox_id}").status_code == 200


def test_every_door_answers_503_in_its_own_shape_while_nobody_can_read(embedded):  # type: ignore[no-untyped-def]
    e2b = embedded.api.post(
        "/e2b/sandboxes", json={"templateID": "base"}, headers={"X-API-Key": embedded.key}
    )
    assert e2b.status_code == 201, e2b.text
    e2b_sandbox = e2b.json()
    embedded.new_log()
    with embedded.locked("EXCLUSIVE"):
        _assert_unavailable(embedded.api.get("/api/v1/sandboxes"))
        _assert_unavailable(embedded.api.post("/api/v1/run", json={"command": "true"}))

        e2b_listed = embedded.api.get("/e2b/v2/sandboxes", headers={"X-API-Key": embedded.key})
        body = _assert_unavailable(e2b_listed)
        assert body["code"] == 503 and "retry" in body["message"]  # E2B's SDK reads these

        rpc = embedded.api.post(
            "/e2b/process.Process/List",
            content=json.dumps({}),
            headers={
                "Content-Type": "application/json",
                "Connect-Protocol-Version": "1",
                "X-Access-Token": e2b_sandbox["envdAccessToken"],
                "E2b-Sandbox-Id": e2b_sandbox["sandboxID"],
            },
        )
        assert rpc.status_code == 503, rpc.text  # Connect's HTTP status for UNAVAILABLE
        assert rpc.json()["code"] == "unavailable", rpc.text

        page = httpx.get(embedded.base + "/accounts/login/", timeout=30)
        page = httpx.post(
            embedded.base + "/accounts/login/",
            data={
                "username": "demo@sandpit.local",
                "password": "x",
                "csrfmiddlewaretoken": page.cookies["csrftoken"],
            },
            cookies=page.cookies,
            headers={"Referer": embedded.base + "/accounts/login/"},
            timeout=30,
        )
        assert page.status_code == 503, (page.status_code, page.text[:300])
        assert page.headers["Retry-After"] == "1" and "retry" in page.text

        socket_url = embedded.base.replace("http", "ws", 1)
        with connect(
            f"{socket_url}/ws/sandboxes/{e2b_sandbox['sandboxID']}/events",
            additional_headers={"Authorization": f"Bearer {embedded.key}"},
            open_timeout=30,
        ) as socket:
            refusal = json.loads(socket.recv(timeout=30))
            assert refusal["type"] == "error" and refusal["code"] == "database_unavailable"
            with pytest.raises(ConnectionClosed) as closed:
                socket.recv(timeout=30)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 4503

        # Beat's periodic tasks skip the run with a warning (the next run retries).
        tasks = subprocess.run(
            [
                PYTHON,
                "manage.py",
                "shell",
                "-c",
                "from billing.tasks import flush_usage; from sandboxes.tasks import "
                "reap_sandboxes, reconcile_sandboxes; "
                "print(flush_usage(), reap_sandboxes(), reconcile_sandboxes())",
            ],
            cwd=ROOT,
            env=embedded.env,
            capture_output=True,
            text=True,
        )
        assert tasks.returncode == 0, tasks.stderr
        assert tasks.stdout.strip().endswith("None None None"), tasks.stdout
        assert tasks.stderr.count("skipped, the database could not serve") == 3, tasks.stderr
        assert "Traceback" not in tasks.stderr
    log = embedded.new_log()
    assert "Traceback" not in log, log
    assert "Database unavailable (answered 503)" in log
    gone = embedded.api.delete(
        f"/e2b/sandboxes/{e2b_sandbox['sandboxID']}", headers={"X-API-Key": embedded.key}
    )
    assert gone.status_code == 204, gone.text
