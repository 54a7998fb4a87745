"""The e2b SDK's processes and polled watchers across two web processes (the pair of
daphnes of tests/realtime/test_across_processes.py, sharing PostgreSQL and Redis): a PTY
and a command started through A are listed, connected to, typed into, resized and killed
through B by the same pid, and a watcher created through A is polled through B, after A
died too, because the agent holds them all.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from tests.realtime.conftest import Server
from tests.realtime.test_across_processes import (  # noqa: F401 - fixtures
    PROVIDERS,
    _kill,
    _provider_or_skip,
    launcher,
    server_a,
    server_b,
    spawned_b,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _opts(server: Server, key: str) -> dict[str, Any]:
    return {"api_key": key, "api_url": f"{server.http}/e2b", "sandbox_url": f"{server.http}/e2b"}


def _filesystem_rpc(server: Server, key: str, sandbox_id: str, method: str, body: Any) -> Any:
    """One envd filesystem call through `server`, as Connect's JSON protocol carries it
    (the SDK's watch handle keeps to the server that created it)."""
    response = httpx.post(
        f"{server.http}/e2b/filesystem.Filesystem/{method}",
        json=body,
        headers={"X-API-Key": key, "E2b-Sandbox-Id": sandbox_id},
        timeout=15,
    )
    assert response.status_code == 200, response.text
    return response.json()


def _until(poll: Any, timeout: float = 15.0) -> Any:
    """`poll()` again until it returns something (a watcher's events arrive a moment after
    the write)."""
    deadline = time.monotonic() + timeout
    while not (found := poll()):
        if time.monotonic() > deadline:
            raise AssertionError("nothing came")
        time.sleep(0.1)
    return found


class Collected:
    """What a handle's wait() hands its callbacks, read from a thread."""

    def __init__(self, handle: Any, kind: str) -> None:
        self.data = bytearray()
        self.ended = threading.Event()
        self._kind = kind
        threading.Thread(target=self._read, args=(handle,), daemon=True).start()

    def _read(self, handle: Any) -> None:
        def add(chunk: bytes | str) -> None:
            self.data.extend(chunk if isinstance(chunk, bytes) else chunk.encode())

        try:
            if self._kind == "pty":
                handle.wait(on_pty=add)
            else:
                handle.wait(on_stdout=add)
        except Exception:  # noqa: BLE001, S110 - killed, or its server died: the end either way
            pass
        self.ended.set()

    def wait_for(self, needle: bytes, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.data:
            if time.monotonic() > deadline:
                raise AssertionError(f"no {needle!r} in {bytes(self.data)!r}")
            time.sleep(0.02)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_processes_started_through_one_web_process_are_driven_through_another(  # type: ignore[no-untyped-def]
    server_a,  # noqa: F811 - the fixture imported above
    server_b,  # noqa: F811
    key_a,
    provider,
    monkeypatch,
):
    from e2b import Sandbox
    from e2b.sandbox.commands.command_handle import PtySize

    _provider_or_skip(provider)
    for name in ("E2B_DOMAIN", "E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY", "E2B_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    a, proc_a = server_a
    sbx_a = Sandbox.create(template=provider, timeout=120, **_opts(a, key_a))
    sandbox_id = sbx_a.sandbox_id
    sbx_b = Sandbox.connect(sandbox_id, **_opts(server_b, key_a))
    try:
        # A PTY and a command, started through A.
        pty = sbx_a.pty.create(PtySize(rows=24, cols=80))
        pty_on_a = Collected(pty, "pty")
        cat = sbx_a.commands.run("cat", background=True, stdin=True, envs={"WHO": "a"})
        cat_on_a = Collected(cat, "command")

        # B lists them by the pids A handed out, connects, types; both see it.
        listed = {p.pid: p for p in sbx_b.commands.list()}
        assert set(listed) == {pty.pid, cat.pid}
        assert listed[cat.pid].envs == {"WHO": "a"}
        pty_on_b = Collected(sbx_b.pty.connect(pty.pid), "pty")
        sbx_b.pty.send_stdin(pty.pid, b"echo from-b-$((6*7))\n")
        pty_on_a.wait_for(b"from-b-42")
        pty_on_b.wait_for(b"from-b-42")
        sbx_b.pty.resize(pty.pid, PtySize(rows=33, cols=111))
        sbx_a.pty.send_stdin(pty.pid, b"stty size; MARK=kept-$((2*3))\n")
        pty_on_b.wait_for(b"33 111")
        cat_on_b = Collected(sbx_b.commands.connect(cat.pid), "command")
        sbx_b.commands.send_stdin(cat.pid, "line one\n")
        cat_on_a.wait_for(b"line one\n")
        cat_on_b.wait_for(b"line one\n")

        # A polled watcher made through A answers its polls through B (and A).
        sbx_a.files.make_dir("watched")
        made = _filesystem_rpc(a, key_a, sandbox_id, "CreateWatcher", {"path": "watched"})
        poll = {"watcherId": made["watcherId"]}

        def polled(server: Server) -> Any:
            found = _filesystem_rpc(server, key_a, sandbox_id, "GetWatcherEvents", poll)
            return {event["name"] for event in found.get("events", [])}

        sbx_b.files.write("watched/one.txt", "1")
        assert "one.txt" in _until(lambda: polled(server_b))
        _until(lambda: polled(server_b) == set())  # nothing of one.txt left to come
        sbx_b.files.write("watched/two.txt", "2")
        assert _until(lambda: polled(a)) == {"two.txt"}  # from where B's poll left off
        _until(lambda: polled(a) == set())

        # A dies; through B both go on.
        _kill(proc_a)
        assert {p.pid for p in sbx_b.commands.list()} == {pty.pid, cat.pid}
        sbx_b.pty.send_stdin(pty.pid, b"echo still-$MARK\n")
        pty_on_b.wait_for(b"still-kept-6")
        sbx_b.commands.send_stdin(cat.pid, "line two\n")
        cat_on_b.wait_for(b"line two\n")
        sbx_b.files.write("watched/three.txt", "3")
        assert _until(lambda: polled(server_b)) == {"three.txt"}

        # B kills them: its streams end, the list empties, a second kill finds nothing.
        assert sbx_b.commands.kill(cat.pid) is True
        assert cat_on_b.ended.wait(10)
        assert sbx_b.pty.kill(pty.pid) is True
        assert pty_on_b.ended.wait(10)
        assert sbx_b.commands.list() == []
        assert sbx_b.commands.kill(cat.pid) is False
        _filesystem_rpc(server_b, key_a, sandbox_id, "RemoveWatcher", poll)
        gone = httpx.post(
            f"{server_b.http}/e2b/filesystem.Filesystem/GetWatcherEvents",
            json=poll,
            headers={"X-API-Key": key_a, "E2b-Sandbox-Id": sandbox_id},
            timeout=15,
        )
        assert gone.status_code == 404, gone.text
    finally:
        sbx_b.kill()
