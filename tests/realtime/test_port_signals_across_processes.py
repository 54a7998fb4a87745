"""Port and process signals across two web processes (the pair of daphnes of
test_across_processes.py, sharing PostgreSQL and Redis): a server started through A is
signalled to an events socket on B, and its end too, after A died. Each process polls
the sandboxes its own sockets listen to (sandboxes/watchers.py), so no signal depends on
the process that started what it reports.
"""

from __future__ import annotations

import pytest

from .conftest import Api, recv_json
from .test_across_processes import (  # noqa: F401 - fixtures
    PROVIDERS,
    _kill,
    _provider_or_skip,
    _sandbox,
    launcher,
    server_a,
    server_b,
    spawned_b,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_port_opened_through_one_process_is_signalled_on_another(  # type: ignore[no-untyped-def]
    server_a,  # noqa: F811 - the fixture imported above
    server_b,  # noqa: F811
    key_a,
    provider,
):
    _provider_or_skip(provider)
    a, proc_a = server_a
    api_a, api_b = Api(a, key_a), Api(server_b, key_a)
    sandbox_id = _sandbox(api_a, provider)
    base = f"/api/v1/sandboxes/{sandbox_id}"
    try:
        events_b = server_b.ws(f"/ws/sandboxes/{sandbox_id}/events", key=key_a)
        assert {"ports", "processes"} <= set(recv_json(events_b, "ready")["signals"])
        started = api_a.post(
            f"{base}/commands",
            json={"command": "exec python3 -m http.server 8123", "background": True},
        )
        assert started.status_code == 202, started.text
        pid = started.json()["pid"]
        opened = recv_json(events_b, "port_open", timeout=20)
        assert opened["port"] == 8123
        assert opened["url"] == f"/sandboxes/{sandbox_id}/ports/8123/"

        _kill(proc_a)
        stopped = api_b.post(f"{base}/processes/{pid}/signal", json={"signal": "SIGKILL"})
        assert stopped.status_code == 200, stopped.text
        assert recv_json(events_b, "port_closed", timeout=20)["port"] == 8123
        exited = recv_json(events_b, "process_exit", timeout=20)
        assert exited["pid"] == pid
        events_b.close()
    finally:
        api_b.delete(base)
