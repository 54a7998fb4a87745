"""The web server freezes the heap it starts with and collects the youngest generation less
often (playground/webserver.py): full collections no longer walk the loaded application.
Its ready callable also drops Django's request_started receivers (playground/webthreads.py)."""

from __future__ import annotations

import gc
import http.client
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from playground.webserver import GC_YOUNGEST_THRESHOLD, freeze_startup_heap
from tests.servers import free_port, server_start


@pytest.fixture
def restored_collector() -> Iterator[None]:
    threshold = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


def test_freezing_moves_the_live_heap_out_of_collections(restored_collector: None) -> None:
    gc.unfreeze()
    older = gc.get_threshold()[1:]
    survivor = [object()]  # a container alive now, like a loaded module's objects
    assert any(survivor is obj for obj in gc.get_objects())
    freeze_startup_heap()
    assert gc.get_freeze_count() > 10_000
    # Frozen: no generation holds it, so no collection visits it again.
    assert not any(survivor is obj for obj in gc.get_objects())
    assert gc.get_threshold() == (GC_YOUNGEST_THRESHOLD, *older)


def _get_json(port: int, path: str) -> dict[str, object]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        body = response.read()
        assert response.status == 200, body[:500]
        return json.loads(body)
    finally:
        conn.close()


def test_the_launched_server_serves_with_a_frozen_heap(tmp_path: Path) -> None:
    """Also what the same ready callable does for request threads (playground/webthreads.py,
    tested in-process in test_web_threads.py): no request_started receivers left."""
    port = free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "playground.settings",
        "SANDPIT_WEB_PROCESSES": "1",
        "SANDPIT_LOCAL_WARM_POOL": "0",  # no jails: only the collector is asked about
        "DJANGO_DEBUG": "false",  # as deployed: with DEBUG, reset_queries has work
    }
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        proc = server_start(port, env, out, app="tests.playground.gc_probe_asgi:application")
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.1)
        state = _get_json(port, "/test/gc-state")
        # The ready callable runs once daphne listens: a first request may come before it.
        ready_by = time.monotonic() + 20
        while not state["frozen"] and time.monotonic() < ready_by:
            time.sleep(0.1)
            state = _get_json(port, "/test/gc-state")
        assert state["frozen"] > 50_000, state  # the whole loaded application
        assert state["threshold"][0] == GC_YOUNGEST_THRESHOLD, state
        assert state["resolver_frozen"], state  # URLs loaded before the first request
        assert _get_json(port, "/test/request-started") == {"listeners": False}
        assert _get_json(port, "/health/live")
    finally:
        proc.terminate()
        proc.wait(30)
