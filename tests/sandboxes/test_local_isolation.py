"""The local provider's jail: what sandboxed code must not see or do to the host or to others.

Real bubblewrap, real cgroups, no mocks. Uses the session `local_provider`
from tests/sandboxes/conftest.py.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandboxes.providers.base import (
    Capability,
    CapabilityNotSupported,
    ExecRequest,
    ExecResult,
    ProviderError,
    ResourceExhausted,
    Resources,
    SandboxGone,
    SandboxSpec,
    SandboxState,
)
from sandboxes.providers.local import LocalProvider, net
from tests.requirements import jail_root, missing_part
from tests.sandboxes.snippets import run_code

REPO = Path(__file__).resolve().parents[2]

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
        result = run_code(local_provider, sandbox, code, "python")
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


def test_user_code_cannot_write_the_jails_log_on_the_host(local_provider, make_sandbox):
    """The agent's stderr goes to a host file in the jail root (jail.log, root's, 0600), which
    may be a size-capped tmpfs shared by every sandbox (volume.root_in_memory): a sandbox
    filling it would stop everyone's creates. It can neither open it through the agent's
    descriptors nor make the agent write to it with malformed requests."""
    sandbox = make_sandbox()
    log = local_provider.root_dir / sandbox / "jail.log"
    before = log.stat().st_size
    opened = sh(local_provider, sandbox, "head -c 100000 /dev/zero > /proc/1/fd/2")
    assert opened.exit_code != 0
    assert b"Permission denied" in opened.stderr
    program = (REPO / "tests/sandboxes/inside/garbage_to_agent.py").read_bytes()
    local_provider.write_file(sandbox, "garbage_to_agent.py", program)
    sent = local_provider.exec(
        sandbox, ExecRequest(command="python3", args=["garbage_to_agent.py", "50"], timeout_s=120)
    )
    assert (sent.exit_code, sent.stdout) == (0, b"400\n"), sent.stderr
    assert sh(local_provider, sandbox, "echo still answering").stdout == b"still answering\n"
    assert log.stat().st_size == before


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
        lambda: run_code(
            local_provider,
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
        lambda: run_code(local_provider, victim, code, "python", timeout_s=60),
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


def test_commands_carry_every_limit_however_they_are_started(local_provider, make_sandbox):
    # Commands in the default cwd are posix_spawned (the agent carries the inheritable
    # limits; RLIMIT_CPU and the OOM preference are set right after exec); others are
    # forked with every limit applied first. Both must end up with the same limits.
    mib = 1024 * 1024
    sandbox = make_sandbox(resources=Resources(open_files=300, disk_mb=16, cpu_time_s=1))
    local_provider.mkdir(sandbox, "sub")
    expected = f"300\n{16 * mib // 512}\n0\n".encode()
    for cwd in (None, "sub"):
        shown = local_provider.exec(
            sandbox, ExecRequest(command="ulimit -n; ulimit -f; ulimit -c", cwd=cwd)
        )
        assert shown.stdout == expected, cwd
        burn = local_provider.exec(
            sandbox,
            ExecRequest(command="python3", args=["-c", "while True: pass"], cwd=cwd, timeout_s=30),
        )
        assert burn.exit_code in (-signal.SIGXCPU, -signal.SIGKILL), (cwd, burn)
        assert not burn.timed_out
    # start_process answers once the process is fully set up: read what it really got.
    proc = local_provider.start_process(sandbox, "sleep", args=["30"])
    seen = sh(
        local_provider, sandbox, f"cat /proc/{proc.pid}/limits /proc/{proc.pid}/oom_score_adj"
    ).stdout.decode()
    assert re.search(r"Max cpu time\s+1\s+1\s", seen), seen
    assert re.search(r"Max open files\s+300\s+300\s", seen), seen
    assert re.search(rf"Max file size\s+{16 * mib}\s+{16 * mib}\s", seen), seen
    assert re.search(r"Max core file size\s+0\s+0\s", seen), seen
    assert seen.rstrip().endswith("500")  # user code, not the agent, is the OOM victim


def test_agent_outlives_running_out_of_descriptors(local_provider, make_sandbox):
    # The agent carries the sandbox's fd limit; a flood of connections must make it wait
    # for descriptors, not die, and the provider must wait for a full backlog to drain
    # rather than call the sandbox stopped.
    sandbox = make_sandbox(resources=Resources(open_files=256, pids=1024, memory_mb=512))
    flood = []
    try:
        refused = 0
        while len(flood) < 600 and refused < 25:
            try:
                flood.append(local_provider._connect(sandbox, timeout=0.05))
                refused = 0
            except SandboxGone:  # the backlog stayed full for 50 ms: the agent is at its limit
                refused += 1
        # More connections than the agent may hold descriptors: it hit EMFILE on accept.
        assert len(flood) > 256
    finally:
        for conn in flood:
            conn.close()
    assert sh(local_provider, sandbox, "echo still-$((6*7))").stdout == b"still-42\n"


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


def test_two_roots_with_one_sandbox_id_keep_apart(local_provider):  # type: ignore[no-untyped-def]
    """Two installations (or test workers) on one host may create the same sandbox id: each
    root's jails have cgroups of their own, so destroying one leaves the other running."""
    other = LocalProvider(root_dir=jail_root("other-installation"))
    sandbox_id = "same-" + uuid.uuid4().hex[:8]
    mine = local_provider.create(SandboxSpec(sandbox_id=sandbox_id)).provider_id
    try:
        theirs = other.create(SandboxSpec(sandbox_id=sandbox_id)).provider_id
        try:
            cgroups = [
                json.loads((p.root_dir / s / "state.json").read_text())["cgroups"]
                for p, s in ((local_provider, mine), (other, theirs))
            ]
            if not cgroups[0]:
                missing_part("writable cgroups (jails run without them here)")
            assert set(cgroups[0].values()).isdisjoint(cgroups[1].values()), cgroups
        finally:
            assert other.destroy(theirs)
        assert sh(local_provider, mine, "echo alive").stdout == b"alive\n"
    finally:
        local_provider.destroy(mine)
        other.close()
    # The other root's cgroup parents went with its last jail.
    assert not any(os.path.exists(os.path.dirname(path)) for path in cgroups[1].values())


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
    listed = {h.provider_id: h.state for h in local_provider.list_sandboxes()}
    assert listed[sandbox] == SandboxState.STOPPED
    with pytest.raises(SandboxGone):
        local_provider.exec(sandbox, ExecRequest(command="true"))
    local_provider.write_file(sandbox, "files-still-work.txt", b"ok")
    assert local_provider.destroy(sandbox) is True
    assert local_provider.destroy(sandbox) is False


# ---------------------------------------------------------------------------
# network=True: a namespace of its own, outbound through slirp4netns, no host
# ---------------------------------------------------------------------------


@pytest.fixture
def needs_network(local_provider) -> None:  # type: ignore[no-untyped-def]
    if Capability.NETWORK not in local_provider.capabilities:
        missing_part("slirp4netns or nftables is not installed (scripts/setup.sh installs them)")


def test_networked_sandbox_has_its_own_interface_route_and_dns(
    local_provider, make_sandbox, needs_network
):
    sandbox = make_sandbox(network=True)
    result = sh(local_provider, sandbox, "cat /proc/net/route /etc/resolv.conf /proc/net/dev")
    out = result.stdout.decode()
    routes = [line.split() for line in out.splitlines() if line.startswith("tap0")]
    # the default route goes through slirp's gateway 10.0.2.2 (little-endian hex)
    assert ["tap0", "00000000", "0202000A"] in [r[:3] for r in routes], out
    assert f"nameserver {net.SLIRP_DNS}" in out
    host_ifaces = {name for name in os.listdir("/sys/class/net") if name not in ("lo", "tap0")}
    jail_ifaces = {line.split(":")[0].strip() for line in out.splitlines() if ":" in line}
    assert not host_ifaces & jail_ifaces


def test_networked_sandboxes_started_side_by_side_all_start(local_provider, needs_network):  # type: ignore[no-untyped-def]
    # slirp4netns brings the jail's loopback up as bwrap sets it up: started beside bwrap's
    # set-up, one in a few creates failed here ("loopback: Failed RTM_NEWADDR").
    made: list[str] = []
    failures: list[str] = []
    lock = threading.Lock()

    def create_some() -> None:
        for _ in range(10):
            try:
                spec = SandboxSpec(sandbox_id=uuid.uuid4().hex, network=True)
                sid = local_provider.create(spec).provider_id
            except ProviderError as exc:
                with lock:
                    failures.append(str(exc))
                continue
            with lock:
                made.append(sid)

    threads = [threading.Thread(target=create_some) for _ in range(3)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not failures, failures[:3]
        assert len(made) == 30
        outcome = sh(local_provider, made[-1], "cat /proc/net/route")
        assert "tap0" in outcome.stdout.decode()
    finally:
        for sid in made:
            local_provider.destroy(sid)


def _connect_from(local_provider, sandbox: str, hosts: list[str], port: int) -> dict[str, str]:  # type: ignore[no-untyped-def]
    code = (
        "import json, socket\n"
        "out = {}\n"
        f"for host in {hosts!r}:\n"
        "    try:\n"
        f"        socket.create_connection((host, {port}), timeout=3).close()\n"
        "        out[host] = 'connected'\n"
        "    except OSError as e:\n"
        "        out[host] = repr(e)\n"
        "print(json.dumps(out))\n"
    )
    result = run_code(local_provider, sandbox, code, "python", timeout_s=60)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_networked_sandbox_cannot_reach_services_on_the_host(
    local_provider, make_sandbox, needs_network
):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", 0))  # noqa: S104 - the point is a service on every host address
    server.listen(8)
    server.setblocking(False)
    port = server.getsockname()[1]
    try:
        sandbox = make_sandbox(network=True)
        # 10.0.2.2 is slirp's gateway, which maps to the host's 127.0.0.1 unless disabled;
        # the others are the host's own addresses, reachable through slirp's host sockets.
        hosts = ["127.0.0.1", net.SLIRP_GATEWAY, *(str(a) for a in net.host_addresses())]
        assert len(hosts) > 3, "the host has no address besides loopback to try"
        outcome = _connect_from(local_provider, sandbox, hosts, port)
        assert "connected" not in outcome.values(), outcome
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()


def test_network_is_refused_without_slirp4netns(tmp_path, monkeypatch):
    monkeypatch.setattr(net, "find_tools", lambda: None)
    provider = LocalProvider(root_dir=jail_root("sandboxes"))
    assert Capability.NETWORK not in provider.capabilities
    with pytest.raises(CapabilityNotSupported, match="slirp4netns"):
        provider.create(SandboxSpec(sandbox_id="no-net", network=True))
    assert not (tmp_path / "sandboxes" / "no-net").exists()
    handle = provider.create(SandboxSpec(sandbox_id="offline"))
    assert provider.destroy(handle.provider_id)


# ---------------------------------------------------------------------------
# disk: the whole sandbox is capped at disk_mb
# ---------------------------------------------------------------------------

_FILL = """
import errno, os
n = 0
try:
    while True:
        fd = os.open(f"f{n}", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.write(fd, b"x" * 16384)
        finally:
            os.close(fd)
        n += 1
except OSError as e:
    print(n, errno.errorcode[e.errno])
    raise SystemExit(1)
"""


def _mounts() -> str:
    with open("/proc/mounts") as f:
        return f.read()


def test_many_small_files_stop_at_disk_mb_off_the_host_disk(local_provider, make_sandbox):
    if os.geteuid() != 0:
        missing_part("the workspace quota needs Sandpit to run as root (it mounts a tmpfs)")
    root = local_provider.root_dir
    host_before = os.statvfs(root)
    sandbox = make_sandbox(resources=Resources(disk_mb=16))
    workspace = root / sandbox / "workspace"
    assert os.stat(workspace).st_dev != os.stat(root).st_dev
    assert f" {root / sandbox}/" in _mounts()

    result = run_code(local_provider, sandbox, _FILL, "python", timeout_s=60)
    assert result.exit_code == 1, result.stderr
    count, err = result.stdout.split()
    assert err == b"ENOSPC"
    assert 14 * 1024 * 1024 <= int(count) * 16384 <= 16 * 1024 * 1024
    assert sh(local_provider, sandbox, "echo more > /tmp/more").exit_code != 0
    with pytest.raises(ResourceExhausted):
        local_provider.write_file(sandbox, "host-side.bin", b"y" * (2 * 1024 * 1024))
    # long code goes through a file in /tmp (sandboxes/code_runs.py's write step)
    with pytest.raises(ProviderError, match="Could not write the code file"):
        run_code(local_provider, sandbox, "#" * 2_000_000, "python")
    assert local_provider.stats(sandbox).disk_bytes >= 14 * 1024 * 1024

    host_after = os.statvfs(root)
    used_on_host = (host_before.f_bavail - host_after.f_bavail) * host_after.f_frsize
    assert used_on_host < 8 * 1024 * 1024

    assert local_provider.destroy(sandbox)
    assert str(root / sandbox) not in _mounts()
    assert not (root / sandbox).exists()


def test_destroy_unmounts_even_while_a_host_process_holds_the_workspace(
    local_provider, make_sandbox
):
    sandbox = make_sandbox()
    workspace = local_provider.root_dir / sandbox / "workspace"
    watch = local_provider.watch(sandbox, ".")
    held = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert local_provider.destroy(sandbox)
        assert str(local_provider.root_dir / sandbox) not in _mounts()
        assert not (local_provider.root_dir / sandbox).exists()
    finally:
        os.close(held)
        watch.close()  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------
# terminals and child processes
# ---------------------------------------------------------------------------


def test_pty_write_to_a_destroyed_sandbox_raises_sandbox_gone(local_provider, make_sandbox):
    sandbox = make_sandbox()
    session = local_provider.open_pty(sandbox)
    try:
        local_provider.destroy(sandbox)
        with pytest.raises(SandboxGone):
            for _ in range(100):  # the first write may still land in the socket buffer
                session.write(b"echo hi\n")
                time.sleep(0.01)
    finally:
        session.close()
    with pytest.raises(SandboxGone):
        session.write(b"x")


def test_pty_write_gives_up_when_the_shell_takes_no_input(local_provider, make_sandbox):
    sandbox = make_sandbox()
    session = local_provider.open_pty(sandbox)
    session.write_timeout_s = 0.5
    try:
        # Non-canonical and no echo: the line discipline then throttles the writer once its
        # buffer is full (in canonical mode it would drop input instead, and with echo on,
        # whether it blocks depends on the output being read). The marker comes from the
        # command itself, so the x's below cannot reach bash's line editor first.
        session.write(b"stty -icanon -echo; echo stalled-$((6*7)); exec sleep 1000\n")
        _read_pty_until(session, b"stalled-42")
        started = time.monotonic()
        with pytest.raises(ProviderError) as excinfo:
            for _ in range(64):
                session.write(b"x" * 1024 * 1024)
        assert not isinstance(excinfo.value, SandboxGone)
        assert time.monotonic() - started < 10
    finally:
        session.close()


def _read_pty_until(session, needle: bytes, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    seen = b""
    deadline = time.monotonic() + timeout_s
    while needle not in seen:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"{needle!r} not seen in {seen[-300:]!r}"
        select.select([session.fileno()], [], [], min(remaining, 0.5))
        try:
            seen += session.read()
        except BlockingIOError:
            continue


def _reaped(pid: int) -> bool:
    """True once `pid` is no zombie child of this process (gone, or not ours)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return True
    return int(fields[1]) != os.getpid()


def test_jail_destroyed_by_another_process_leaves_no_zombie(local_provider, make_sandbox):
    network = Capability.NETWORK in local_provider.capabilities
    sandbox = make_sandbox(network=network)
    state = json.loads((local_provider.root_dir / sandbox / "state.json").read_text())
    children = [state["bwrap_pid"]] + ([state["slirp_pid"]] if network else [])
    assert all(not _reaped(pid) for pid in children)
    destroy = (
        "import sys\n"
        "from pathlib import Path\n"
        "from sandboxes.providers.local import LocalProvider\n"
        "assert LocalProvider(Path(sys.argv[1])).destroy(sys.argv[2])\n"
    )
    subprocess.run(  # noqa: S603 - our own interpreter and script
        [sys.executable, "-c", destroy, str(local_provider.root_dir), sandbox],
        cwd=REPO,
        check=True,
        timeout=60,
    )
    end = time.monotonic() + 5
    while not all(_reaped(pid) for pid in children):
        assert time.monotonic() < end, f"zombies left: {children}"
        time.sleep(0.02)


def test_missing_bwrap_names_what_to_install(tmp_path):
    from sandboxes.providers.base import ProviderUnavailable, SandboxSpec
    from sandboxes.providers.local import LocalProvider

    provider = LocalProvider(root_dir=jail_root("sbx"), bwrap_path="/nonexistent/bwrap")
    health = provider.health()
    assert not health.ok and "apt-get install bubblewrap" in health.detail
    with pytest.raises(ProviderUnavailable, match="apt-get install bubblewrap"):
        provider.create(SandboxSpec(sandbox_id="nobwrap"))
