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
import zipfile
from pathlib import Path

import pytest

from sandboxes.agent import wire
from sandboxes.providers import agent_bundle
from sandboxes.providers.local.jail import JAIL_PYTHON
from tests.requirements import missing_part

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
        "ctypes",  # loaded later, on a thread of its own (spawn.start_loading)
        "runpy",
        "importlib.util",
    }
)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """The modules an agent has after importing everything a warm jail loads at start."""
    if not Path(JAIL_PYTHON).exists():
        missing_part(f"{JAIL_PYTHON} (the jails' interpreter) is not installed")
    bundle = tmp_path_factory.mktemp("agent") / "agent.pyz"
    bundle.write_bytes(agent_bundle.compiled(JAIL_PYTHON, bundle.parent))
    package = agent_bundle.PACKAGE
    probe = (
        f"import sys; sys.path.insert(0, {str(bundle)!r}); "
        f"import {package}.server, {package}.sessions; "
        "print(' '.join(sorted(sys.modules)))"
    )
    done = subprocess.run(  # noqa: S603 - the jails' interpreter and our bundle
        [JAIL_PYTHON, "-I", "-S", "-c", probe], capture_output=True, text=True, check=True
    )
    return set(done.stdout.split())


def test_the_agent_starts_without_the_heavy_modules(loaded: set[str]) -> None:
    assert f"{agent_bundle.PACKAGE}.server" in loaded  # the probe really imported the agent
    assert f"{agent_bundle.PACKAGE}.sessions" in loaded
    assert not HEAVY & loaded, f"the agent's start-up imports {sorted(HEAVY & loaded)}"


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
