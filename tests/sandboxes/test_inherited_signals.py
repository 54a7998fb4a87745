"""Nothing a sandbox runs inherits the signal state of whoever started the server.

A server started by a script (CI, an init script, `make run &`) has SIGINT and SIGQUIT
ignored, and some supervisors leave SIGCHLD blocked; ignored dispositions and the mask
survive exec. Once passed on, Ctrl-C never interrupted anything in a local terminal.
The probe (signals_probe.py) runs a provider of its own under exactly that state.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.requirements import jail_root

REPO = Path(__file__).resolve().parents[2]


def _signals(mask: str) -> set[int]:
    bits = int(mask, 16)
    return {n + 1 for n in range(64) if bits >> n & 1}


@pytest.fixture(scope="module")
def report() -> dict:
    proc = subprocess.run(  # noqa: S603 - our interpreter and modules
        [
            sys.executable,
            "-m",
            "tests.unfriendly_launch",
            sys.executable,
            "-m",
            "tests.sandboxes.signals_probe",
            str(jail_root("signals")),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("path", ["spawned", "forked", "code", "background", "terminal"])
def test_nothing_is_ignored_or_blocked(report, path):
    state = report[path]
    assert set(state) == {"SigIgn", "SigBlk"}, state
    # glibc's own two (32 and 33) included: os.posix_spawn would leave them ignored.
    ignored = _signals(state["SigIgn"])
    assert ignored == set(), f"{path}: ignored {sorted(ignored)}"
    assert _signals(state["SigBlk"]) == set(), f"{path}: blocked {state['SigBlk']}"
    assert signal.SIGINT not in _signals(state["SigIgn"])


def test_ctrl_c_interrupts_a_foreground_job(report):
    assert report["ctrl_c_worked"], report


@pytest.mark.docker
def test_docker_commands_start_with_every_signal_at_its_default(docker_provider):
    """The agent in the image starts commands with every signal at its default (glibc's
    internal ones included: sandboxes/agent/spawn.py), whatever the engine's own
    processes ignore; on both of its paths (posix_spawn, and fork for another cwd)."""
    import uuid

    from sandboxes.providers.base import ExecRequest, SandboxSpec

    sandbox = docker_provider.create(SandboxSpec(sandbox_id=uuid.uuid4().hex)).provider_id
    try:
        for request in (
            ExecRequest(command="grep", args=["^Sig", "/proc/self/status"]),
            ExecRequest(command="grep ^Sig /proc/self/status", cwd="/tmp"),
        ):
            lines = docker_provider.exec(sandbox, request).stdout.decode().splitlines()
            state = dict(line.split(":\t", 1) for line in lines if line.startswith("Sig"))
            assert _signals(state["SigIgn"]) == set(), (request, state)
            assert _signals(state["SigBlk"]) == set(), (request, state)
    finally:
        docker_provider.destroy(sandbox)
