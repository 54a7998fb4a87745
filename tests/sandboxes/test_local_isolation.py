"""The local provider's jail: what sandboxed code must not see or do to the host or to others.

Real bubblewrap, real cgroups, no mocks. Uses the session `local_provider`
from tests/sandboxes/conftest.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from sandboxes.providers.base import (
    ExecRequest,
    ExecResult,
    ProviderError,
    Resources,
    SandboxGone,
    SandboxSpec,
    SandboxState,
)

MakeSandbox = Callable[..., str]


@pytest.fixture
def make_sandbox(local_provider) -> Iterator[MakeSandbox]:  # type: ignore[no-untyped-def]
    created: list[str] = []

    def make(**spec_kw) -> str:  # type: ignore[no-untyped-def]
        handle = local_provider.create(SandboxSpec(sandbox_id=uuid.uuid4().hex, **spec_kw))
        created.append(handle.provider_id)
        return handle.provider_id

    yield make
    for provider_id in created:
        local_provider.destroy(provider_id)


def sh(provider, sandbox: str, command: str, timeout_s: float = 30.0) -> ExecResult:  # type: ignore[no-untyped-def]
    return provider.exec(sandbox, ExecRequest(command=command, timeout_s=timeout_s))


@pytest.mark.parametrize(
    "command",
    [
        "cat /work/main/playground/settings.py",
        "ls /work",
        "ls /root",
        "cat /etc/shadow",
        "ls /home",
        "cat /etc/ssl/private/*",
        "ls /sys/fs/cgroup",
    ],
)
def test_host_files_are_invisible(local_provider, make_sandbox, command):
    sandbox = make_sandbox()
    result = sh(local_provider, sandbox, command)
    assert result.exit_code != 0
    assert result.stdout == b""


def test_identity_inside_the_jail(local_provider, make_sandbox):
    sandbox = make_sandbox()
    out = sh(local_provider, sandbox, "hostname; id -u; id -g; cat /proc/self/status").stdout
    lines = out.decode().splitlines()
    assert lines[0] == "sandbox"
    assert lines[1] == "1000"
    assert lines[2] == "1000"
    cap_eff = next(line for line in lines if line.startswith("CapEff:"))
    assert cap_eff.split()[1] == "0000000000000000"


def test_host_secrets_are_not_in_the_environment(local_provider, make_sandbox, monkeypatch):
    monkeypatch.setenv("SANDPIT_TEST_SECRET", "hunter2-do-not-leak")
    sandbox = make_sandbox(env={"VISIBLE": "yes"})
    result = sh(local_provider, sandbox, "env; tr '\\0' '\\n' < /proc/1/environ")
    assert b"hunter2" not in result.stdout
    assert b"SANDPIT_TEST_SECRET" not in result.stdout
    assert b"VISIBLE=yes" in result.stdout


def test_loopback_server_on_the_host_is_unreachable(local_provider, make_sandbox):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        sandbox = make_sandbox(network=False)
        code = (
            "import socket\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            "    print('connected')\n"
            "except OSError as e:\n"
            "    print('refused', e)\n"
        )
        result = local_provider.run_code(sandbox, code, "python")
        assert result.stdout.startswith(b"refused"), result.stdout
        outside = sh(
            local_provider,
            sandbox,
            "python3 -c \"import socket; socket.getaddrinfo('example.com', 80)\"",
        )
        assert outside.exit_code != 0
    finally:
        server.close()


def test_other_sandboxes_files_and_processes_are_invisible(local_provider, make_sandbox):
    first = make_sandbox()
    second = make_sandbox()
    local_provider.write_file(first, "secret-of-first.txt", b"mine")
    local_provider.start_process(first, "sleep", args=["4242"])
    listing = sh(
        local_provider,
        second,
        "ls -a /workspace /tmp; find / -name 'secret-of-f*' 2>/dev/null;"
        " for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done",
    ).stdout
    assert b"secret-of-first.txt" not in listing
    assert b"4242" not in listing


def test_user_code_cannot_kill_the_agent(local_provider, make_sandbox):
    sandbox = make_sandbox()
    sh(local_provider, sandbox, "kill -9 1; kill -TERM 1; kill -9 -1")
    assert sh(local_provider, sandbox, "echo alive").stdout == b"alive\n"


def _other_sandbox_answers_during(local_provider, make_sandbox, attack) -> ExecResult:  # type: ignore[no-untyped-def]
    """Run `attack` in one sandbox while another keeps answering; returns the attack result."""
    bystander = make_sandbox()
    results: list[ExecResult] = []
    thread = threading.Thread(target=lambda: results.append(attack()))
    thread.start()
    try:
        for _ in range(5):
            assert sh(local_provider, bystander, "echo ok").stdout == b"ok\n"
    finally:
        thread.join(timeout=120)
    assert results, "the attack never returned"
    return results[0]


def test_fork_bomb_is_contained(local_provider, make_sandbox):
    victim = make_sandbox(resources=Resources(pids=64))
    result = _other_sandbox_answers_during(
        local_provider,
        make_sandbox,
        # Every copy keeps forking and survives failed forks, so the command stays in
        # the foreground until the timeout reaps the whole tree.
        lambda: local_provider.run_code(
            victim,
            "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
            "python",
            timeout_s=5,
        ),
    )
    assert result.timed_out
    assert result.exit_code == -9
    # the jail recovers once the bomb is gone
    assert sh(local_provider, victim, "echo recovered").stdout == b"recovered\n"


def test_memory_bomb_is_killed(local_provider, make_sandbox):
    victim = make_sandbox(resources=Resources(memory_mb=128))
    code = "chunks = []\nwhile True:\n    chunks.append(b'x' * 50_000_000)\n"
    result = _other_sandbox_answers_during(
        local_provider,
        make_sandbox,
        lambda: local_provider.run_code(victim, code, "python", timeout_s=60),
    )
    assert result.exit_code == -9
    assert result.oom_killed
    assert not result.timed_out
    assert sh(local_provider, victim, "echo recovered").stdout == b"recovered\n"


def test_disk_fill_stops_at_the_file_size_limit(local_provider, make_sandbox):
    victim = make_sandbox(resources=Resources(disk_mb=8))
    result = _other_sandbox_answers_during(
        local_provider,
        make_sandbox,
        lambda: sh(local_provider, victim, "dd if=/dev/zero of=big bs=1M count=100"),
    )
    assert result.exit_code != 0
    assert local_provider.stat(victim, "big").size <= 8 * 1024 * 1024


def test_destroy_reaps_every_process_and_cgroup(local_provider, make_sandbox):
    sandbox = make_sandbox()
    local_provider.start_process(sandbox, "sleep", args=["1000"])
    state_dir = local_provider.root_dir / sandbox
    state = json.loads((state_dir / "state.json").read_text())
    assert local_provider.destroy(sandbox)
    assert not state_dir.exists()
    for path in state["cgroups"].values():
        assert not os.path.exists(path)
    try:
        with open(f"/proc/{state['jail_pid']}/stat") as f:
            assert f.read().split(") ")[1][0] in "ZX"
    except FileNotFoundError:
        pass


def test_networked_sandbox_cannot_proxy_to_host_ports(local_provider, make_sandbox):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        sandbox = make_sandbox(network=True)
        assert port not in {p.port for p in local_provider.open_ports(sandbox)}
        with pytest.raises(ProviderError):
            local_provider.connect_port(sandbox, port)
    finally:
        server.close()


def test_sandbox_whose_jail_died_is_listed_stopped_and_destroyable(local_provider, make_sandbox):
    sandbox = make_sandbox()
    state = json.loads((local_provider.root_dir / sandbox / "state.json").read_text())
    os.kill(state["jail_pid"], signal.SIGKILL)

    def stopped() -> bool:
        return local_provider.get(sandbox).state == SandboxState.STOPPED

    end = time.monotonic() + 10
    while not stopped():
        assert time.monotonic() < end, "jail still reported running"
        time.sleep(0.02)
    listed = {h.provider_id: h.state for h in local_provider.list()}
    assert listed[sandbox] == SandboxState.STOPPED
    with pytest.raises(SandboxGone):
        local_provider.exec(sandbox, ExecRequest(command="true"))
    local_provider.write_file(sandbox, "files-still-work.txt", b"ok")
    assert local_provider.destroy(sandbox) is True
    assert local_provider.destroy(sandbox) is False
