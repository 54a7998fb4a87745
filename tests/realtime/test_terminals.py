"""Terminals end to end: REST on daphne, a WebSocket per client, the local provider's PTY."""

from __future__ import annotations

import time

import pytest
from websockets.exceptions import ConnectionClosed

from .conftest import SERVER_INSTALLATION, TerminalOutput, open_terminal

pytestmark = pytest.mark.django_db(transaction=True)


def _attach(server, key, terminal) -> TerminalOutput:  # type: ignore[no-untyped-def]
    return TerminalOutput(server.ws(terminal["ws_path"], key=key))


def test_interactive_python_session_in_a_terminal(server, rt_api_a, key_a, sbx_a):  # type: ignore[no-untyped-def]
    terminal = open_terminal(rt_api_a, sbx_a)
    assert terminal["ws_url"].startswith("ws://") and terminal["id"].startswith("term_")
    term = _attach(server, key_a, terminal)
    term.read_until(r"\$ ")
    term.send("python3\r")
    term.read_until(">>> ")
    term.send(b"print(6*7)\r")
    term.read_until(r"\r\n42\r\n")
    term.ws.send('{"type": "input", "data": "exit()\\r"}')
    term.read_until(r"exit\(\)\r\n.*\$ $")


def test_ctrl_c_interrupts_a_running_command(server, rt_api_a, key_a, sbx_a):  # type: ignore[no-untyped-def]
    term = _attach(server, key_a, open_terminal(rt_api_a, sbx_a))
    term.read_until(r"\$ ")
    # The marker prints from the foreground job itself, so ^C cannot race bash's fork.
    term.send("sh -c 'echo running-$((6*7)); exec sleep 100'\r")
    term.read_until("running-42")
    started = time.monotonic()
    term.send(b"\x03")
    term.send("echo after-$((40+2))\r")
    term.read_until("after-42", timeout=5)
    assert time.monotonic() - started < 5


def test_resize_over_the_socket_and_rest_changes_stty_size(server, rt_api_a, key_a, sbx_a):  # type: ignore[no-untyped-def]
    terminal = open_terminal(rt_api_a, sbx_a, cols=80, rows=24)
    term = _attach(server, key_a, terminal)
    term.read_until(r"\$ ")
    term.ws.send('{"type": "resize", "cols": 132, "rows": 43}')
    time.sleep(0.2)
    term.send("stty size\r")
    term.read_until(r"43 132\r\n")
    response = rt_api_a.post(
        f"/api/v1/sandboxes/{sbx_a}/terminals/{terminal['id']}/resize",
        json={"cols": 90, "rows": 30},
    )
    assert response.status_code == 200, response.text
    assert (response.json()["cols"], response.json()["rows"]) == (90, 30)
    term.send("stty size\r")
    term.read_until(r"30 90\r\n")


def test_two_clients_see_output_and_reconnect_replays_scrollback(server, rt_api_a, key_a, sbx_a):  # type: ignore[no-untyped-def]
    terminal = open_terminal(rt_api_a, sbx_a)
    first = _attach(server, key_a, terminal)
    second = _attach(server, key_a, terminal)
    first.read_until(r"\$ ")
    first.send("echo shared-$((6*7))\r")
    first.read_until(r"shared-42\r\n")
    second.read_until(r"shared-42\r\n")
    listed = rt_api_a.get(f"/api/v1/sandboxes/{sbx_a}/terminals").json()["results"]
    assert [t["id"] for t in listed] == [terminal["id"]] and listed[0]["clients"] == 2
    first.ws.close()
    second.ws.close()
    # Both browsers gone: the shell lives on, and a new socket gets the recent output first.
    again = _attach(server, key_a, terminal)
    again.read_until(r"shared-42\r\n")
    again.send("echo still-$((1+1))\r")
    again.read_until("still-2")


def test_output_bytes_reach_the_client_unaltered(server, rt_api_a, key_a, sbx_a):  # type: ignore[no-untyped-def]
    term = _attach(server, key_a, open_terminal(rt_api_a, sbx_a))
    term.read_until(r"\$ ")
    # 200 KB of 3-byte characters: PTY reads split them, the frames must carry raw bytes.
    term.send(
        "python3 -c \"import sys; sys.stdout.buffer.write('€'.encode()*70000 + b'|E' + b'ND|')\"\r"
    )
    data = term.read_until(r"\|END\|", timeout=20)
    text = data.decode("utf-8")  # strict: any re-encoding damage would raise
    assert text.count("€") >= 70000


def test_delete_kills_the_shell_and_tells_clients(server, rt_api_a, key_a, sbx_a):  # type: ignore[no-untyped-def]
    terminal = open_terminal(rt_api_a, sbx_a)
    term = _attach(server, key_a, terminal)
    term.read_until(r"\$ ")
    response = rt_api_a.delete(f"/api/v1/sandboxes/{sbx_a}/terminals/{terminal['id']}")
    assert response.status_code == 204
    assert term.wait_control("exit")["type"] == "exit"
    with pytest.raises(ConnectionClosed):
        for _ in range(10):
            term.ws.recv(timeout=5)
    assert rt_api_a.get(f"/api/v1/sandboxes/{sbx_a}/terminals").json()["results"] == []
    missing = rt_api_a.delete(f"/api/v1/sandboxes/{sbx_a}/terminals/{terminal['id']}")
    assert missing.status_code == 404


def test_shell_exit_sends_exit_code(server, rt_api_a, key_a, sbx_a):  # type: ignore[no-untyped-def]
    term = _attach(server, key_a, open_terminal(rt_api_a, sbx_a))
    term.read_until(r"\$ ")
    term.send("exit 3\r")
    assert term.wait_control("exit") == {"type": "exit", "code": 3}


def test_each_enter_counts_one_execution(server, rt_api_a, key_a, sbx_a, org_a, settings):  # type: ignore[no-untyped-def]
    from django.utils import timezone

    from billing.metering import get_meter
    from billing.pricing import period_start

    settings.SANDPIT_INSTALLATION = SERVER_INSTALLATION  # the daphne's meter keys

    def executions() -> int:
        now = timezone.now()
        return get_meter().period_state(org_a.pk, period_start(now), now).executions

    term = _attach(server, key_a, open_terminal(rt_api_a, sbx_a))
    term.read_until(r"\$ ")
    before = executions()
    term.send("echo a\r\necho b\r")  # a pasted CRLF is one Enter: 2
    term.send(b"echo c\n")  # 3
    term.read_until(r"\rc\r\n")
    deadline = time.monotonic() + 5
    while executions() - before < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert executions() - before == 3
