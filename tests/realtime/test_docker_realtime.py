"""The same real-time paths on the docker provider (skipped where no engine runs)."""

from __future__ import annotations

import json

import pytest

from tests.requirements import missing_part

from .conftest import TerminalOutput, create_sandbox, open_terminal, recv_json

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]


@pytest.fixture(params=["runc", "runsc"])
def docker_sbx(request, server, rt_api_a, org_a):  # type: ignore[no-untyped-def]
    """A docker sandbox of org A under each runtime: runsc through the organization's
    docker_runtime (the one daphne serves both), so the same paths are proved under gVisor."""
    from django.conf import settings

    from accounts.models import Organization
    from tests.docker_support import docker_provider_or_skip, docker_runsc_provider_or_skip

    if "docker" not in settings.SANDPIT_PROVIDERS:
        missing_part("SANDPIT_PROVIDERS does not enable docker")
    docker_provider_or_skip()
    if request.param == "runsc":
        docker_runsc_provider_or_skip()
        Organization.objects.filter(pk=org_a.pk).update(docker_runtime="runsc")
    sandbox_id = create_sandbox(rt_api_a, provider="docker")
    expected = "gvisor" if request.param == "runsc" else "container"
    assert rt_api_a.get(f"/api/v1/sandboxes/{sandbox_id}").json()["isolation"] == expected
    yield sandbox_id
    rt_api_a.delete(f"/api/v1/sandboxes/{sandbox_id}")


def test_docker_terminal_python_resize_ctrl_c_and_preview(server, rt_api_a, key_a, docker_sbx):  # type: ignore[no-untyped-def]
    events = server.ws(f"/ws/sandboxes/{docker_sbx}/events", key=key_a)
    recv_json(events, "ready")
    events.send(json.dumps({"type": "watch", "id": "w", "path": "."}))
    recv_json(events, "watching", timeout=20)
    term = TerminalOutput(server.ws(open_terminal(rt_api_a, docker_sbx)["ws_path"], key=key_a))
    term.read_until(r"\$ ", timeout=15)
    gvisor = rt_api_a.get(f"/api/v1/sandboxes/{docker_sbx}").json()["isolation"] == "gvisor"
    if gvisor:
        # The terminal's shell itself runs on gVisor's kernel, not just the sandbox's row.
        term.send("dmesg | head -n 1\r")
        term.read_until("Starting gVisor")
    term.send("python3\r")
    term.read_until(">>> ")
    term.send("print(6*7)\r")
    term.read_until(r"\r\n42\r\n")
    term.send("exit()\r")
    term.read_until(r"\$ $")
    if not gvisor:  # ^C under gVisor: test_ctrl_c_under_gvisor below
        _ctrl_c_interrupts_the_foreground_job(term)
    term.ws.send('{"type": "resize", "cols": 111, "rows": 33}')
    term.send("stty size\r")
    term.read_until(r"33 111\r\n")
    term.send("touch from-docker.txt; python3 -m http.server 8000 >/dev/null 2>&1 &\r")
    # Earlier writes (python's .python_history) may come in a batch of their own first.
    paths: set[str] = set()
    while "from-docker.txt" not in paths:
        paths |= {e["path"] for e in recv_json(events, "files", timeout=15)["events"]}
    opened = recv_json(events, "port_open", timeout=20)
    page = rt_api_a.get(opened["url"])
    assert page.status_code == 200 and "from-docker.txt" in page.text
    # A body of many Engine frames arrives byte for byte (no frame headers leak through).
    blob = bytes(range(256)) * 1200
    put = rt_api_a.put(
        f"/api/v1/sandboxes/{docker_sbx}/files/content", params={"path": "blob.bin"}, content=blob
    )
    assert put.status_code in (200, 201, 204), put.text
    fetched = rt_api_a.get(opened["url"] + "blob.bin")
    assert fetched.status_code == 200 and fetched.content == blob
    events.close()


def _ctrl_c_interrupts_the_foreground_job(term: TerminalOutput) -> None:
    # The marker prints from the foreground job itself, so ^C cannot race bash's fork.
    term.send("sh -c 'echo running-$((6*7)); exec sleep 100'\r")
    term.read_until("running-42")
    term.send(b"\x03")
    term.send("echo after-$((40+2))\r")
    term.read_until("after-42", timeout=5)


@pytest.mark.parametrize("docker_sbx", ["runsc"], indirect=True)
def test_ctrl_c_does_not_reach_the_foreground_job_under_this_runsc(  # type: ignore[no-untyped-def]
    server, rt_api_a, key_a, docker_sbx
):
    """The documented gVisor limitation, checked: runsc 20221219 (Debian's) does not signal
    the foreground process group when VINTR reaches a pty with ISIG on (and answers
    TIOCGPGRP on the master with ENOTTY), so ^C typed in a terminal leaves the job running.
    This turns red the day a runsc fixes it; then the README's note and this test go."""
    term = TerminalOutput(server.ws(open_terminal(rt_api_a, docker_sbx)["ws_path"], key=key_a))
    term.read_until(r"\$ ", timeout=15)
    with pytest.raises(AssertionError):
        _ctrl_c_interrupts_the_foreground_job(term)


def test_docker_websocket_preview_echoes(server, rt_api_a, key_a, docker_sbx):  # type: ignore[no-untyped-def]
    from .test_preview_websocket import _start_echo_server

    prefix = _start_echo_server(rt_api_a, docker_sbx)
    with server.ws(f"{prefix}/echo", key=key_a) as ws:
        assert ws.recv(timeout=10) == "path /echo"
        ws.send("hello, container")
        assert ws.recv(timeout=10) == "hello, container"
        ws.send(b"\x00\xff" * 40000)
        assert ws.recv(timeout=10) == b"\x00\xff" * 40000
