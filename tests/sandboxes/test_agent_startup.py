"""The agent's start-up imports only the C halves of the modules it uses.

Every local sandbox and warm jail starts the agent, so what it imports is paid once per
sandbox: `socket`, `json`, `typing` and the modules they pull in (enum, re, collections,
selectors) cost a cold jail about a quarter of its CPU (bench/bench_local_provider.py
prints the CPU per cold sandbox). This checks the bundle as the jails run it (compiled
by their interpreter), without timing anything.
"""

from __future__ import annotations

import io
import socket
import subprocess
import threading
import time
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxes.agent import wire
from sandboxes.agent.spawn import SHIM_SPAWNS_BEFORE_LIBC
from sandboxes.providers import agent_bundle
from sandboxes.providers.base import ExecRequest, SandboxProvider, SandboxSpec
from sandboxes.providers.local import c_helpers
from sandboxes.providers.local.jail import JAIL_EXEC_SHIM, JAIL_PYTHON
from sandboxes.providers.local.provider import EXEC_SHIM
from tests.requirements import missing_part
from tests.sandboxes.test_provider_contract import read_pty_until

HEAVY = frozenset(
    {
        "socket",
        "selectors",
        "enum",
        "collections",
        "json",
        "re",
        "typing",
        "subprocess",
        "signal",
        "threading",
        "ctypes",  # loaded later, on a thread of its own, where there is no exec shim
        "runpy",
        "importlib.util",
    }
)


FIRST_USE = frozenset(
    {
        # what only terminals, ports, file operations and sessions need (server.load_more,
        # server.load_sessions): ~1.5 ms of CPU at every jail's start otherwise
        "os",
        "posixpath",
        "_collections_abc",
        "termios",
        *(f"{agent_bundle.PACKAGE}.{name}" for name in ("files", "ports", "terminal", "sessions")),
    }
)


@pytest.fixture(scope="module")
def agent_bundle_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundle as the jails run it (compiled by their interpreter)."""
    if not Path(JAIL_PYTHON).exists():
        missing_part(f"{JAIL_PYTHON} (the jails' interpreter) is not installed")
    bundle = tmp_path_factory.mktemp("agent") / "agent.pyz"
    bundle.write_bytes(agent_bundle.compiled(JAIL_PYTHON, bundle.parent))
    return bundle


def _modules_after(bundle: Path, *imports: str) -> set[str]:
    """The modules the jails' interpreter holds after importing `imports` from `bundle`."""
    names = ", ".join(f"{agent_bundle.PACKAGE}.{name}" for name in imports)
    probe = (
        f"import sys; sys.path.insert(0, {str(bundle)!r}); import {names}; "
        "print(' '.join(sorted(sys.modules)))"
    )
    done = subprocess.run(  # noqa: S603 - the jails' interpreter and our bundle
        [JAIL_PYTHON, "-I", "-S", "-c", probe], capture_output=True, text=True, check=True
    )
    return set(done.stdout.split())


def test_the_agent_starts_without_the_heavy_modules(agent_bundle_file: Path) -> None:
    """Not even once sessions are loaded (the heaviest of the ops loaded on first use)."""
    loaded = _modules_after(agent_bundle_file, "server", "sessions", "files", "terminal")
    assert f"{agent_bundle.PACKAGE}.server" in loaded  # the probe really imported the agent
    assert f"{agent_bundle.PACKAGE}.sessions" in loaded
    assert not HEAVY & loaded, f"the agent's start-up imports {sorted(HEAVY & loaded)}"


def test_a_jail_starts_without_what_only_some_requests_need(agent_bundle_file: Path) -> None:
    """Every jail, warm or cold, starts the agent (server.py): the modules of the ops that
    a sandbox running commands never calls load on their first request."""
    loaded = _modules_after(agent_bundle_file, "server")
    assert {f"{agent_bundle.PACKAGE}.{name}" for name in ("execute", "procs", "spawn")} <= loaded
    assert not FIRST_USE & loaded, f"a jail's start imports {sorted(FIRST_USE & loaded)}"


def test_the_agent_starts_from_its_compiled_modules(tmp_path: Path) -> None:
    """The bundle the jails run holds bytecode for every module (compiling at each start
    costs several times the imports themselves)."""
    if not Path(JAIL_PYTHON).exists():
        missing_part(f"{JAIL_PYTHON} (the jails' interpreter) is not installed")
    bundle = agent_bundle.compiled(JAIL_PYTHON, tmp_path)
    names = set(zipfile.ZipFile(io.BytesIO(bundle)).namelist())
    package = f"{agent_bundle.PACKAGE}/"
    sources = {name for name in names if name.startswith(package) and name.endswith(".py")}
    assert sources
    assert {name + "c" for name in sources} <= names


PT_INTERP = 3


@pytest.fixture
def jail_id(local_provider: SandboxProvider) -> Iterator[str]:
    handle = local_provider.create(SandboxSpec(sandbox_id=uuid.uuid4().hex))
    try:
        yield handle.provider_id
    finally:
        local_provider.destroy(handle.provider_id)


def test_a_cold_jail_starts_its_first_commands_through_the_shim(
    local_provider: SandboxProvider, jail_id: str
) -> None:
    """The agent (PID 1 in the jail) starts its first command through the exec shim
    without loading ctypes (~2 ms of CPU per jail); after SHIM_SPAWNS_BEFORE_LIBC it loads
    libc's posix_spawn, and the commands after that still get every signal at its default,
    glibc's internal two included (test_inherited_signals.py covers the other paths)."""
    time.sleep(0.3)  # an agent loading it as it starts would have by now (10-40 ms)
    maps = local_provider.exec(jail_id, ExecRequest(command="cat", args=["/proc/1/maps"]))
    assert maps.exit_code == 0 and b"python3" in maps.stdout  # the agent's own map
    assert b"_ctypes" not in maps.stdout and b"libffi" not in maps.stdout
    shim = local_provider.exec(jail_id, ExecRequest(command="test", args=["-x", JAIL_EXEC_SHIM]))
    assert shim.exit_code == 0, "no exec shim in the jail"
    assert f"commands start through the {EXEC_SHIM}" in local_provider.health().detail
    assert SHIM_SPAWNS_BEFORE_LIBC == 2  # these two commands were the shim's
    deadline = time.monotonic() + 30
    while b"_ctypes" not in maps.stdout:
        assert time.monotonic() < deadline, "the agent never loaded libc's posix_spawn"
        time.sleep(0.05)
        maps = local_provider.exec(jail_id, ExecRequest(command="cat", args=["/proc/1/maps"]))
    status = local_provider.exec(
        jail_id, ExecRequest(command="grep", args=["^Sig", "/proc/self/status"])
    )
    state = dict(line.split(":\t", 1) for line in status.stdout.decode().splitlines())
    assert int(state["SigIgn"], 16) == 0 and int(state["SigBlk"], 16) == 0, state


def test_the_first_requests_of_every_kind_at_once_all_load_what_they_need(
    provider: SandboxProvider, sandbox: str
) -> None:
    """On a fresh sandbox, whose agent loads the terminal, port, file and process ops on
    their first use: the first request of each kind, all at once from threads of their
    own, each get their answer (none finds the ops half loaded by another)."""
    provider.write_file(sandbox, "/workspace/seen.txt", b"seen")
    answers: dict[str, object] = {}
    barrier = threading.Barrier(6)

    def pty() -> object:
        session = provider.open_pty(sandbox, cols=80, rows=24)
        try:
            session.write(b"echo pty-$((6*7))\n")
            return b"pty-42" in read_pty_until(session, b"pty-42")
        finally:
            session.close()

    calls = {
        "pty": pty,
        "ports": lambda: provider.open_ports(sandbox),
        "read": lambda: provider.read_file(sandbox, "/workspace/seen.txt"),
        "list": lambda: sorted(entry.name for entry in provider.list_files(sandbox, "/workspace")),
        "processes": lambda: provider.list_processes(sandbox),
        "exec": lambda: provider.exec(sandbox, ExecRequest(command="echo", args=["ran"])).stdout,
    }

    def call(name: str) -> None:
        barrier.wait(10)
        try:
            answers[name] = calls[name]()
        except Exception as exc:  # noqa: BLE001 - reported below, per call
            answers[name] = exc

    threads = [threading.Thread(target=call, args=(name,)) for name in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    processes = answers.pop("processes")  # the terminal's shell, when it opened first
    assert isinstance(processes, list), processes
    assert answers == {
        "pty": True,
        "ports": [],
        "read": b"seen",
        "list": ["seen.txt"],
        "exec": b"ran\n",
    }


PLANTED = ("os", "posixpath", "termios", "fcntl", "struct", "ctypes", "files", "ports", "terminal")


def test_modules_the_agent_loads_on_first_use_cannot_be_planted_by_the_sandbox(
    provider: SandboxProvider, sandbox: str
) -> None:
    """The agent runs in the sandbox's working directory (/workspace), which the sandbox's
    code writes: modules named like those the agent imports on first use, planted there, in
    /tmp and in a package of the agent's name, are never what it imports (`-I`: no working
    directory or environment on its path). Each would leave a mark if it ran."""
    for directory in ("/workspace", "/tmp", f"/workspace/{agent_bundle.PACKAGE}"):
        for name in PLANTED:
            provider.write_file(
                sandbox,
                f"{directory}/{name}.py",
                f"open('/tmp/planted-{name}-ran', 'w').close()\n".encode(),
            )
    provider.write_file(sandbox, f"/workspace/{agent_bundle.PACKAGE}/__init__.py", b"")
    session = provider.open_pty(sandbox, cols=80, rows=24)  # terminal, fcntl, termios
    try:
        session.write(b"echo pty-$((6*7))\n")
        read_pty_until(session, b"pty-42")
    finally:
        session.close()
    assert provider.open_ports(sandbox) == []  # ports
    assert provider.read_file(sandbox, "/workspace/os.py").startswith(b"open(")  # files
    for _ in range(SHIM_SPAWNS_BEFORE_LIBC + 1):  # then ctypes, where there is a shim
        provider.exec(sandbox, ExecRequest(command="true", args=[]))
    marks = provider.exec(sandbox, ExecRequest(command="sh", args=["-c", "ls /tmp | grep ran"]))
    assert marks.stdout == b"", marks.stdout


@pytest.mark.parametrize(
    ("command", "cwd"),
    [("./notes", None), ("/workspace/notes", "/tmp")],
    ids=["shim", "fork"],
)
def test_a_command_that_cannot_be_executed_is_reported_like_a_shell(
    local_provider: SandboxProvider, jail_id: str, command: str, cwd: str | None
) -> None:
    """Found and executable, but not a program (no #! line): exec's error on the command's
    stderr with status 127, in the same words whether the shim reports it (posix_spawn in
    the workspace) or the agent's forked child (another working directory)."""
    local_provider.write_file(jail_id, "/workspace/notes", b"echo not run\n")
    local_provider.exec(jail_id, ExecRequest(command="chmod", args=["+x", "notes"]))
    result = local_provider.exec(jail_id, ExecRequest(command=command, args=[], cwd=cwd))
    assert result.exit_code == 127
    assert result.stdout == b""
    assert result.stderr == f"sandpit: {command}: Exec format error\n".encode()


def _has_program_interpreter(elf: bytes) -> bool:
    """Whether a 64-bit little-endian ELF file has a PT_INTERP program header."""
    assert elf[:4] == b"\x7fELF" and elf[4] == 2 and elf[5] == 1, "not a 64-bit LE ELF file"
    offset = int.from_bytes(elf[32:40], "little")
    size = int.from_bytes(elf[54:56], "little")
    count = int.from_bytes(elf[56:58], "little")
    types = [
        int.from_bytes(elf[offset + i * size : offset + i * size + 4], "little")
        for i in range(count)
    ]
    return PT_INTERP in types


def test_the_exec_shim_is_static_and_built_once(tmp_path: Path) -> None:
    """Static, so that it runs in a template's root file system whatever its libc; readable
    and executable by the jails' uids; compiled once per source version."""
    built = c_helpers.build_exec_shim(tmp_path)
    if built is None:
        missing_part("no C compiler (with a static libc) to build the exec shim")
    assert built.stat().st_mode & 0o777 == 0o755
    assert not _has_program_interpreter(built.read_bytes())  # static: no ld.so to find
    ran = subprocess.run(  # noqa: S603 - our shim running /bin/echo
        [str(built), "/bin/echo", "echo", "a", "b"], capture_output=True, check=False
    )
    assert (ran.returncode, ran.stdout) == (0, b"a b\n")
    stamp = built.stat().st_mtime_ns
    assert c_helpers.build_exec_shim(tmp_path, compiler="/nonexistent/cc") == built
    assert built.stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [built.name]


class _WithoutPrivateAccept:
    """A listening socket as an interpreter without `_socket.socket._accept` would give it."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def fileno(self) -> int:
        return self._sock.fileno()


@pytest.mark.parametrize("without_private_accept", [False, True])
def test_accept_hands_over_working_connections(
    tmp_path: Path, without_private_accept: bool
) -> None:
    """wire.accept, both ways: the C socket's own, and the socket module's where an
    interpreter lacks it; the listening socket keeps accepting after either."""
    path = str(tmp_path / "agent.sock")
    server = wire.socket.socket(wire.socket.AF_UNIX, wire.socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)
    listening = _WithoutPrivateAccept(server) if without_private_accept else server
    try:
        for n in range(2):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.connect(path)
                conn = wire.accept(listening)  # type: ignore[arg-type]
                try:
                    client.sendall(b"ping %d\n" % n)
                    assert wire.read_line(conn) == (b"ping %d" % n, b"")
                    wire.send_line(conn, {"ok": True, "n": n})
                    assert client.recv(100) == b'{"ok": true, "n": %d}\n' % n
                finally:
                    conn.close()
    finally:
        server.close()
