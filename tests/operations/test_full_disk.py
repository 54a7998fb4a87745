"""A full disk under the embedded defaults: the var directory (SQLite, the usage spool) on a
small tmpfs, filled by something else on the host.

Before, every metered operation answered 500 `internal_error` with a traceback: a command
ran in the sandbox, then its usage record found neither the database nor the spool able
to take it, and the execution went uncounted. Now a metered operation is refused before it
runs (503 `database_unavailable`, Retry-After) while the disk has too little room to
record it, at the REST API and on the sockets (a run, its stdin, a watch: an error frame; a
terminal closes 4503 rather than let typing go uncounted); reads that count nothing go on; and once
space is back, the same requests succeed and are counted. Never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from billing.usage_spool import HEADROOM_BYTES
from sandboxes.providers.local import volume
from tests.requirements import jail_root, missing_part
from tests.servers import (
    embedded_env,
    free_port,
    jails_destroyed,
    manage,
    server_start,
    server_stop,
    wait_until_serving,
)

DISK_MB = 48


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        missing_part("a tmpfs of its own needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "sandpit-full", mount], check=True)  # fmt: skip
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", mount], check=False)


def _fill(disk: Path) -> Path:
    """Fill the disk to the last block, as another program on the host would."""
    filler = disk / "filler"
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=1M"], capture_output=True)
    stats = os.statvfs(disk)
    assert stats.f_bavail * stats.f_frsize < HEADROOM_BYTES
    return filler


def _assert_refused(response: httpx.Response) -> None:
    assert response.status_code == 503, (response.status_code, response.text[:500])
    assert response.headers["Retry-After"] == "1"
    assert response.json()["error"]["code"] == "database_unavailable", response.text


def _socket(base: str, path: str, key: str) -> ClientConnection:
    return connect(
        base.replace("http", "ws", 1) + path,
        additional_headers={"Authorization": f"Bearer {key}"},
        open_timeout=30,
        ping_interval=None,
    )


def _until(socket: ClientConnection, kind: str) -> dict[str, Any]:
    while True:
        frame = socket.recv(timeout=30)
        if isinstance(frame, str):
            message: dict[str, Any] = json.loads(frame)
            if message.get("type") == kind:
                return message


def test_a_full_disk_refuses_metered_operations_before_they_run(small_disk, tmp_path):  # type: ignore[no-untyped-def]
    var = small_disk / "var"
    var.mkdir()
    jails = jail_root("full-disk")
    env = embedded_env(
        var, jails, SANDPIT_API_RATE="1000000/min", SANDPIT_LOCAL_ROOT_IN_MEMORY="true"
    )
    manage(env, "migrate", "--noinput")
    manage(env, "ensure_demo")
    key = manage(env, "create_api_key", "demo", "full-disk")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        process = server_start(port, env, out)
    try:
        wait_until_serving(base, process, log)
        api = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=60)
        created = api.post("/api/v1/sandboxes", json={})
        assert created.status_code == 201, created.text
        sandbox = f"/api/v1/sandboxes/{created.json()['id']}"
        terminal = api.post(f"{sandbox}/terminals", json={})
        assert terminal.status_code == 201, terminal.text
        typing = _socket(base, terminal.json()["ws_path"], key)
        exec_socket = _socket(base, f"/ws/sandboxes/{created.json()['id']}/exec", key)
        events = _socket(base, f"/ws/sandboxes/{created.json()['id']}/events", key)
        _until(events, "ready")
        exec_socket.send(json.dumps({"type": "run", "id": "cat", "command": "cat"}))
        _until(exec_socket, "started")
        before = api.get("/api/v1/usage").json()["executions"]

        filler = _fill(small_disk)
        for refused in (
            api.post(f"{sandbox}/commands", json={"command": "touch /workspace/ran"}),
            api.put(f"{sandbox}/files/content", params={"path": "written.txt"}, content=b"x"),
            api.get(f"{sandbox}/files/content", params={"path": "written.txt"}),
            api.post("/api/v1/sandboxes", json={}),
        ):
            _assert_refused(refused)
        exec_socket.send(json.dumps({"type": "run", "id": "r1", "command": "touch ran-too"}))
        error = _until(exec_socket, "error")
        assert (error["code"], error["id"], error["status"]) == ("database_unavailable", "r1", 503)
        exec_socket.send(json.dumps({"type": "stdin", "id": "cat", "data": "more\n"}))
        error = _until(exec_socket, "error")
        assert (error["code"], error["id"], error["status"]) == ("database_unavailable", "cat", 503)
        events.send(json.dumps({"type": "watch", "id": "w", "path": "."}))
        error = _until(events, "error")
        assert (error["code"], error["status"]) == ("database_unavailable", 503), error
        # A terminal whose typing can no longer be counted says so and closes.
        typing.send(b"echo typed\r")
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                frame = typing.recv(timeout=30)
                if isinstance(frame, str) and json.loads(frame).get("type") == "error":
                    assert json.loads(frame)["code"] == "database_unavailable", frame
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4503
        # What counts nothing still answers.
        assert api.get("/api/v1/sandboxes").status_code == 200
        assert api.get(sandbox).json()["state"] == "running"

        filler.unlink()
        ran = api.post(f"{sandbox}/commands", json={"command": "echo back"})
        assert ran.status_code == 200 and ran.json()["stdout"] == "back\n", ran.text
        listed = api.get(f"{sandbox}/files", params={"path": "."})
        assert listed.status_code == 200, listed.text
        names = {entry["name"] for entry in listed.json()["entries"]}
        assert names.isdisjoint({"ran", "ran-too", "written.txt"}), names
        # Counted: the line typed as the disk filled (it reached the shell; its record was
        # held in memory, then written once the disk took writes again), this command and
        # the listing. Nothing refused ran.
        assert api.get("/api/v1/usage").json()["executions"] == before + 3
        output = log.read_text()
        assert "usage record held in memory until it can" in output, output[-3000:]
        assert "usage record held in memory now kept on disk" in output, output[-3000:]
        assert api.delete(sandbox).status_code == 200
        exec_socket.close()
        events.close()
        output = log.read_text()
        assert "Traceback" not in output, output[output.find("Traceback") - 500 :][:4000]
    finally:
        server_stop(process)
        jails_destroyed(jails)
        volume.release_root(jails)
