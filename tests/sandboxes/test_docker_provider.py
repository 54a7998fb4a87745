"""Docker-specific guarantees the contract suite cannot see: hardening, isolation, limits.

Container state is checked with the `docker` CLI (not the SDK: only the
provider module may import `docker`).
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import suppress

import pytest

from sandboxes.providers import agent_bundle
from sandboxes.providers.base import (
    ExecRequest,
    FileTooLarge,
    InvalidRequest,
    ProviderUnavailable,
    ResourceExhausted,
    Resources,
    SandboxGone,
    SandboxSpec,
    SandboxState,
)
from sandboxes.providers.docker import DockerProvider
from tests.docker_support import (
    TEST_INSTALLATION,
    docker_provider_or_skip,
    docker_runsc_provider_or_skip,
)
from tests.sandboxes.snippets import run_code

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module", params=["runc", "runsc"])
def docker_provider(request: pytest.FixtureRequest) -> DockerProvider:
    """Every guarantee here holds under both runtimes: runc and gVisor's runsc."""
    if request.param == "runsc":
        return docker_runsc_provider_or_skip()
    return docker_provider_or_skip()


@pytest.fixture
def make_sandbox(docker_provider: DockerProvider) -> Iterator:  # type: ignore[type-arg]
    made: list[str] = []

    def make(**spec: object) -> str:
        handle = docker_provider.create(SandboxSpec(sandbox_id=uuid.uuid4().hex, **spec))  # type: ignore[arg-type]
        made.append(handle.provider_id)
        return handle.provider_id

    yield make
    for provider_id in made:
        docker_provider.destroy(provider_id)


def inspect(container_id: str) -> dict:  # type: ignore[type-arg]
    out = subprocess.run(
        ["docker", "inspect", container_id], capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out)[0]  # type: ignore[no-any-return]


def labels_of(info: dict) -> dict:  # type: ignore[type-arg]
    return info["Config"]["Labels"]  # type: ignore[no-any-return]


def sh(provider: DockerProvider, sandbox: str, command: str, **kw):  # type: ignore[no-untyped-def]
    return provider.exec(sandbox, ExecRequest(command=command, **kw))


def test_container_is_hardened(docker_provider, make_sandbox):
    sandbox = make_sandbox(resources=Resources(memory_mb=256, pids=100, cpu_count=0.5, disk_mb=64))
    info = inspect(sandbox)
    host = info["HostConfig"]
    assert host["CapDrop"] == ["ALL"]
    assert not host["CapAdd"]
    assert host["ReadonlyRootfs"] is True
    assert host["Privileged"] is False
    assert any(opt.startswith("no-new-privileges") for opt in host["SecurityOpt"])
    assert info["Config"]["User"] == "1000:1000"
    assert host["NetworkMode"] == "none"
    if docker_provider.isolation == "gvisor":
        assert host["Runtime"] == "runsc"
        assert labels_of(info)["sandpit.isolation"] == "gvisor"
        assert b"Starting gVisor" in sh(docker_provider, sandbox, "dmesg").stdout
    else:
        assert host["Runtime"] == "runc"
        assert 100 <= host["PidsLimit"] <= 100 + 32
    assert host["Memory"] == 256 * 1024 * 1024
    assert host["MemorySwap"] == host["Memory"]
    assert host["NanoCpus"] == 500_000_000
    assert "size=64m" in host["Tmpfs"]["/workspace"]
    limits = {u["Name"]: u for u in host["Ulimits"]}
    assert {"nofile", "fsize", "cpu", "core"} <= set(limits)
    assert limits["core"]["Hard"] == 0
    labels = info["Config"]["Labels"]
    assert labels["sandpit.managed"] == "1"
    assert labels["sandpit.installation"] == TEST_INSTALLATION

    inside = sh(
        docker_provider,
        sandbox,
        "id -u; grep CapEff /proc/self/status; touch /etc/x 2>/dev/null || echo ro-root;"
        " touch /workspace/ok && echo ws-writable",
    ).stdout.decode()
    assert inside.splitlines()[0] == "1000"
    assert "CapEff:\t0000000000000000" in inside
    assert "ro-root" in inside
    assert "ws-writable" in inside


def test_pid_1_is_an_init_that_handles_signals(docker_provider, make_sandbox):
    sandbox = make_sandbox()
    comm = sh(docker_provider, sandbox, "cat /proc/1/comm").stdout.strip()
    assert comm == b"tini"
    started = time.monotonic()
    subprocess.run(["docker", "stop", "-t", "10", sandbox], check=True, capture_output=True)
    assert time.monotonic() - started < 5, "SIGTERM was ignored: docker stop waited its timeout"
    assert docker_provider.get(sandbox).state == SandboxState.STOPPED
    with pytest.raises(SandboxGone):
        sh(docker_provider, sandbox, "true")


def test_cannot_reach_a_server_on_the_host(docker_provider, make_sandbox):
    accepted: list[object] = []
    server = socket.socket()
    server.bind(("0.0.0.0", 0))
    server.listen()
    server.settimeout(0.2)
    port = server.getsockname()[1]
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(server.accept())
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        sandbox = make_sandbox()
        probe = (
            "import socket\n"
            "for host in ('127.0.0.1', '172.17.0.1', 'host.docker.internal'):\n"
            "    try:\n"
            f"        socket.create_connection((host, {port}), timeout=2)\n"
            "        print('reached', host)\n"
            "    except OSError as e:\n"
            "        print('blocked', host, e)\n"
        )
        result = run_code(docker_provider, sandbox, probe, "python")
        assert b"reached" not in result.stdout, result.stdout
        assert result.stdout.count(b"blocked") == 3
        assert (
            sh(docker_provider, sandbox, "ip -o link | grep -v ' lo:' | wc -l").stdout.strip()
            == b"0"
        )
    finally:
        stop.set()
        thread.join(timeout=2)
        server.close()
    assert accepted == []


def test_networked_sandbox_reaches_a_server_on_the_bridge(docker_provider, make_sandbox):
    """network=True works under both runtimes (gVisor's through runsc-net): the sandbox
    reaches a server of ours on the host's end of Docker's bridge, on this machine."""
    server = socket.socket()
    server.bind(("0.0.0.0", 0))
    server.listen()
    port = server.getsockname()[1]
    got: list[bytes] = []

    def serve() -> None:
        server.settimeout(30)
        with suppress(OSError):
            conn, _ = server.accept()
            with conn:
                got.append(conn.recv(64))
                conn.sendall(b"pong")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        sandbox = make_sandbox(network=True)
        probe = (
            "import socket, struct\n"
            "gw = [l.split()[2] for l in open('/proc/net/route') if l.split()[1] == '00000000'][0]\n"
            "host = socket.inet_ntoa(struct.pack('<L', int(gw, 16)))\n"
            f"s = socket.create_connection((host, {port}), timeout=10)\n"
            "s.sendall(b'ping')\n"
            "print(s.recv(4).decode())\n"
        )
        result = run_code(docker_provider, sandbox, probe, "python")
        assert result.stdout == b"pong\n", result
        thread.join(timeout=10)
        assert got == [b"ping"]
        expected = "runsc-net" if docker_provider.isolation == "gvisor" else "runc"
        assert inspect(sandbox)["HostConfig"]["Runtime"] == expected
    finally:
        server.close()


def test_fork_bomb_is_contained(docker_provider, make_sandbox):
    sandbox = make_sandbox(resources=Resources(pids=64, memory_mb=256))
    try:
        result = sh(
            docker_provider, sandbox, "bomb() { bomb | bomb & }; bomb; sleep 30", timeout_s=3
        )
    except ResourceExhausted:
        # gVisor may lose a thread of its own kernel to the host limit: the whole sandbox
        # ends (contained, and said so) rather than only the bomb.
        assert docker_provider.isolation == "gvisor"
        assert not inspect(sandbox)["State"]["Running"]
        return
    assert result.exit_code != 0, result
    # The limit held: the host is fine and the sandbox survives. Killed bomb
    # processes are reaped by tini, so allow a moment before it answers again.
    assert inspect(sandbox)["State"]["Running"]
    deadline = time.monotonic() + 15
    while True:
        # find, not ls: coreutils' statx flags are refused by Debian's gVisor (README).
        try:
            after = sh(docker_provider, sandbox, "find /proc -maxdepth 1 -name '[0-9]*' | wc -l")
        except ResourceExhausted as exc:  # no pid to spare until the killed bomb is reaped
            after = exc
        if not isinstance(after, ResourceExhausted):
            if after.exit_code == 0 and int(after.stdout or 99) < 20:
                break
        assert time.monotonic() < deadline, after
        time.sleep(0.2)


def test_memory_bomb_is_contained(docker_provider, make_sandbox):
    sandbox = make_sandbox(resources=Resources(memory_mb=96))
    try:
        result = run_code(
            docker_provider,
            sandbox,
            "chunks = []\nwhile True:\n    chunks.append(bytearray(16 * 1024 * 1024))\n",
            "python",
            timeout_s=20,
        )
    except ResourceExhausted:
        # Under gVisor the host's OOM killer ends the user-space kernel, so the sandbox.
        assert docker_provider.isolation == "gvisor"
        assert not inspect(sandbox)["State"]["Running"]
        return
    assert result.exit_code != 0
    assert not result.timed_out
    assert result.exit_code == -9 and result.oom_killed or b"MemoryError" in result.stderr
    assert inspect(sandbox)["State"]["Running"]
    assert sh(docker_provider, sandbox, "echo alive").stdout == b"alive\n"


def test_workspace_size_and_file_size_are_limited(docker_provider, make_sandbox):
    sandbox = make_sandbox(resources=Resources(disk_mb=8))
    result = sh(docker_provider, sandbox, "head -c 20000000 /dev/zero > big.bin")
    assert result.exit_code != 0
    with pytest.raises((FileTooLarge, ResourceExhausted)):
        docker_provider.write_file(sandbox, "big2.bin", b"x" * 12_000_000)


class _SlowSecondSend:
    """A connection to the agent whose every send after the first waits until the agent
    has closed its end: the timing a client thread meets on a loaded host, where the agent
    answers a request that needs no more bytes, and closes, before the client sends again."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._sends = 0

    def sendall(self, data: bytes) -> None:
        if self._sends:
            closed = select.poll()
            closed.register(self._sock, select.POLLRDHUP)
            assert closed.poll(20_000), "the agent did not answer and close"
        self._sends += 1
        self._sock.sendall(data)

    def __getattr__(self, name: str) -> object:
        return getattr(self._sock, name)


def test_an_empty_file_is_written_when_the_agent_answers_before_the_client_sends_again(
    docker_provider, make_sandbox, monkeypatch
):
    """An empty body is nothing to send: the agent has all it needs with the header, so it
    may write, answer and close before the client's next send, which then failed (EPIPE:
    "Lost the sandbox agent", seen under a loaded CI run)."""
    sandbox = make_sandbox()
    connect = docker_provider._connect
    monkeypatch.setattr(docker_provider, "_connect", lambda *args: _SlowSecondSend(connect(*args)))
    entry = docker_provider.write_file(sandbox, "empty.txt", b"")
    monkeypatch.undo()
    assert (entry.name, entry.size) == ("empty.txt", 0)
    assert docker_provider.read_file(sandbox, "empty.txt") == b""


def test_timeout_also_kills_children_that_left_the_process_group(docker_provider, make_sandbox):
    sandbox = make_sandbox()
    result = sh(
        docker_provider, sandbox, "setsid sleep 301 & setsid sleep 302 & sleep 303", timeout_s=1
    )
    assert result.timed_out and result.exit_code == -9
    left = sh(docker_provider, sandbox, "ps -eo args").stdout
    assert b"sleep 30" not in left, left


def test_timeout_finds_escaped_children_with_a_huge_environment(docker_provider, make_sandbox):
    # The runner finds escaped children by the tag in their environment: all of it is read,
    # however large (here the tag sits after 200 KB of other variables).
    sandbox = make_sandbox()
    result = docker_provider.exec(
        sandbox,
        ExecRequest(
            command="setsid sleep 304 & sleep 305",
            env={f"PAD{i}": "x" * 20_000 for i in range(10)},
            timeout_s=1,
        ),
    )
    assert result.timed_out and result.exit_code == -9
    left = sh(docker_provider, sandbox, "ps -eo args").stdout
    assert b"sleep 30" not in left, left


def test_connect_port_is_byte_transparent(docker_provider, make_sandbox):
    sandbox = make_sandbox()
    echo = (
        "import socket\n"
        "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "s.bind(('127.0.0.1', 9009)); s.listen()\n"
        "while True:\n"
        "    c, _ = s.accept()\n"
        "    while data := c.recv(65536):\n"
        "        c.sendall(data)\n"
        "    c.close()\n"
    )
    docker_provider.write_file(sandbox, "echo.py", echo.encode())
    docker_provider.start_process(sandbox, "python3", args=["echo.py"])
    deadline = time.monotonic() + 10
    while not any(p.port == 9009 for p in docker_provider.open_ports(sandbox)):
        assert time.monotonic() < deadline, "echo server did not start"
        time.sleep(0.05)
    payload = bytes(range(256)) * 64 + b"\r\n\x03\x04\x1a\x11\x13\x7f"
    stream = docker_provider.connect_port(sandbox, 9009)
    try:
        stream.sendall(payload)
        got = b""
        while len(got) < len(payload):
            chunk = stream.recv(65536)
            assert chunk, "stream ended early"
            got += chunk
    finally:
        stream.close()
    assert got == payload


def test_pty_close_kills_the_shell_and_its_children(docker_provider, make_sandbox):
    sandbox = make_sandbox()
    pty = docker_provider.open_pty(sandbox)
    pty.write(b"sleep 304 &\n")
    deadline = time.monotonic() + 10
    while b"sleep 304" not in sh(docker_provider, sandbox, "ps -eo args").stdout:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    pty.close()
    assert b"sleep 304" not in sh(docker_provider, sandbox, "ps -eo args").stdout


def test_orphans_are_listed_and_other_installations_are_not_touched(docker_provider):
    # An orphan: a container made by an earlier process of this installation.
    earlier = DockerProvider(installation=TEST_INSTALLATION)
    orphan = earlier.create(
        SandboxSpec(sandbox_id="orphan-" + uuid.uuid4().hex[:8], labels={"k": "v"})
    )
    other = DockerProvider(installation="someone-else")
    foreign = other.create(SandboxSpec(sandbox_id="foreign"))
    try:
        subprocess.run(["docker", "kill", orphan.provider_id], check=True, capture_output=True)
        listed = {h.provider_id: h for h in docker_provider.list_sandboxes()}
        assert orphan.provider_id in listed
        assert listed[orphan.provider_id].state == SandboxState.STOPPED
        assert listed[orphan.provider_id].labels["k"] == "v"
        assert (
            listed[orphan.provider_id].labels["sandpit.sandbox_id"]
            == orphan.labels["sandpit.sandbox_id"]
        )
        assert foreign.provider_id not in listed

        assert docker_provider.destroy(foreign.provider_id) is False
        assert inspect(foreign.provider_id)["State"]["Running"]
        with pytest.raises(SandboxGone):
            docker_provider.get(foreign.provider_id)
        with pytest.raises(SandboxGone):
            sh(docker_provider, foreign.provider_id, "true")
    finally:
        assert docker_provider.destroy(orphan.provider_id) is True
        assert other.destroy(foreign.provider_id) is True


def test_destroy_is_idempotent(docker_provider):
    handle = docker_provider.create(SandboxSpec(sandbox_id=uuid.uuid4().hex))
    assert docker_provider.destroy(handle.provider_id) is True
    assert docker_provider.destroy(handle.provider_id) is False
    assert docker_provider.destroy("0" * 64) is False
    assert docker_provider.destroy("not a container id!") is False


def test_unreachable_engine_is_provider_unavailable():
    provider = DockerProvider(base_url="unix:///nonexistent/docker.sock")
    with pytest.raises(ProviderUnavailable):
        provider.health()
    with pytest.raises(ProviderUnavailable):
        provider.list_sandboxes()


def test_duplicate_sandbox_id_is_refused(docker_provider):
    sandbox_id = uuid.uuid4().hex
    first = docker_provider.create(SandboxSpec(sandbox_id=sandbox_id)).provider_id
    try:
        with pytest.raises(InvalidRequest):
            docker_provider.create(SandboxSpec(sandbox_id=sandbox_id))
        with pytest.raises(InvalidRequest):
            docker_provider.create(SandboxSpec(sandbox_id="no spaces or slashes/"))
    finally:
        docker_provider.destroy(first)


def test_long_code_goes_through_stdin_and_keeps_user_stdin(docker_provider, make_sandbox):
    sandbox = make_sandbox()
    code = "# " + "x" * 200_000 + "\nimport sys\nprint(sys.stdin.read().upper())\n"
    result = run_code(docker_provider, sandbox, code, "python", stdin=b"shout")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == b"SHOUT\n"


def test_background_process_exit_code_is_kept(docker_provider, make_sandbox):
    sandbox = make_sandbox()
    info = docker_provider.start_process(sandbox, "sh", args=["-c", "exit 4"])
    deadline = time.monotonic() + 10
    while True:
        listed = {p.pid: p for p in docker_provider.list_processes(sandbox)}
        if info.pid in listed and not listed[info.pid].running:
            break
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert listed[info.pid].exit_code == 4


def test_pty_survives_the_default_detach_keys(docker_provider, make_sandbox):
    sandbox = make_sandbox()
    pty = docker_provider.open_pty(sandbox)
    try:
        pty.write(b"\x10\x11echo still-$((1+1))\n")
        seen = b""
        deadline = time.monotonic() + 10
        while b"still-2" not in seen:
            assert time.monotonic() < deadline, seen
            select.select([pty.fileno()], [], [], 0.5)
            try:
                chunk = pty.read()
            except BlockingIOError:
                continue
            assert chunk, f"terminal detached: {seen!r}"
            seen += chunk
    finally:
        pty.close()


def test_watch_pairs_moves_and_close_stops_the_watcher(docker_provider, make_sandbox):
    sandbox = make_sandbox()
    docker_provider.mkdir(sandbox, "w")
    idle = docker_provider.watch(sandbox, "w")
    idle.close()  # never iterated: must still stop inotifywait
    watcher = docker_provider.watch(sandbox, "w")
    try:
        sh(docker_provider, sandbox, "echo a > w/a.txt && mv w/a.txt w/b.txt && rm w/b.txt")
        events: list = []  # type: ignore[type-arg]
        deadline = time.monotonic() + 10
        while not any(e.type == "deleted" for e in events):
            assert time.monotonic() < deadline, events
            events.extend(next(watcher))
    finally:
        watcher.close()
    kinds = [(e.type, e.path, e.old_path) for e in events]
    assert ("created", "w/a.txt", None) in kinds
    assert ("moved", "w/b.txt", "w/a.txt") in kinds
    assert ("deleted", "w/b.txt", None) in kinds
    assert b"inotifywait" not in sh(docker_provider, sandbox, "ps -eo args").stdout


def test_an_image_without_this_agent_fails_with_a_rebuild_hint(docker_provider):  # type: ignore[no-untyped-def]
    # Like an image built from other Sandpit sources: the sandbox image minus this agent.
    dockerfile = (
        f"FROM {docker_provider.image}\nUSER root\n"
        f"RUN rm -r {os.path.dirname(agent_bundle.image_path())}\nUSER 1000:1000\n"
    )
    subprocess.run(
        ["docker", "build", "--pull=false", "-q", "-t", "sandpit-sandbox:test-no-agent", "-"],
        input=dockerfile.encode(),
        env={**os.environ, "DOCKER_BUILDKIT": "0"},
        capture_output=True,
        check=True,
    )
    outdated = DockerProvider(
        image="sandpit-sandbox:test-no-agent",
        installation=TEST_INSTALLATION,
        runtime=docker_provider.runtime,
    )
    provider_id = outdated.create(SandboxSpec(sandbox_id=uuid.uuid4().hex)).provider_id
    try:
        with pytest.raises(ProviderUnavailable, match="build-sandbox-image.sh"):
            outdated.exec(provider_id, ExecRequest(command="true"))
    finally:
        outdated.destroy(provider_id)


def test_a_sandbox_of_another_sandpit_version_is_refused_and_can_be_destroyed(docker_provider):  # type: ignore[no-untyped-def]
    # Like a container made before an upgrade: ours by its labels, running another agent.
    name = f"sandpit-{TEST_INSTALLATION}-old-{uuid.uuid4().hex[:8]}"
    subprocess.run(
        [
            "docker", "run", "-d", "--name", name, "--network", "none",
            "--label", "sandpit.managed=1", "--label", f"sandpit.installation={TEST_INSTALLATION}",
            docker_provider.image, "sleep", "infinity",
        ],
        capture_output=True,
        check=True,
    )  # fmt: skip
    try:
        with pytest.raises(ProviderUnavailable, match="another version of Sandpit"):
            docker_provider.exec(name, ExecRequest(command="true"))
    finally:
        assert docker_provider.destroy(name) is True
