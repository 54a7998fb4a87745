"""The provider contract against the shared shell layer (cloud/shell.py) on a local `sh`.

Modal, Daytona, Runloop, Vercel and Blaxel build exec, run_code and files on this layer;
their own SDK calls (`_shell` and lifecycle) cannot run here. Capabilities the layer does
not declare (processes, terminals, ports, watch, stats, timeout) are skipped by the
contract's own `needs(...)`.
"""

from __future__ import annotations

import os
import shutil
import uuid

import pytest

from sandboxes.providers.base import CapabilityNotSupported, ExecRequest, SandboxSpec
from tests.requirements import missing_part
from tests.sandboxes import test_provider_contract as contract
from tests.sandboxes.test_provider_contract import *  # noqa: F403 - re-run every contract test


@pytest.fixture(scope="module")
def shell_provider(tmp_path_factory):  # type: ignore[no-untyped-def]
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        missing_part("the local shell stand-in binds each sandbox with unshare (needs root)")
    from tests.cloud.local_shell import LocalShellProvider

    return LocalShellProvider(tmp_path_factory.mktemp("shell-sandboxes"))


@pytest.fixture
def provider(shell_provider):  # type: ignore[no-untyped-def]
    return shell_provider


@pytest.fixture
def sandbox(provider):  # type: ignore[no-untyped-def]
    handle = provider.create(SandboxSpec(sandbox_id=uuid.uuid4().hex))
    yield handle.provider_id
    provider.destroy(handle.provider_id)


@pytest.mark.parametrize(
    ("command", "code"),
    [
        ("true", 0),
        ("exit 7", 7),
        pytest.param(
            "kill -TERM $$",
            -15,
            marks=pytest.mark.xfail(
                strict=True, reason="the shell layer reports 128+N for a signal death (via timeout)"
            ),
        ),
    ],
)
def test_exec_exit_codes(provider, sandbox, command, code):  # type: ignore[no-untyped-def]
    contract.test_exec_exit_codes(provider, sandbox, command, code)


def test_exec_timeout_is_reported_and_kills_the_group(provider, sandbox):  # type: ignore[no-untyped-def]
    result = provider.exec(sandbox, ExecRequest(command="sleep 100 & sleep 100", timeout_s=1))
    assert result.timed_out and result.exit_code == -9


def test_binary_output_and_stdin_survive_the_framing(provider, sandbox):  # type: ignore[no-untyped-def]
    data = bytes(range(256))
    result = provider.exec(sandbox, ExecRequest(command="cat", args=[], stdin=data))
    assert result.stdout == data


def test_large_file_is_written_in_chunks(provider, sandbox):  # type: ignore[no-untyped-def]
    data = os.urandom(200_000)
    assert provider.write_file(sandbox, "big.bin", data).size == len(data)
    assert provider.read_file(sandbox, "big.bin") == data


def test_undeclared_capabilities_answer_not_supported(provider, sandbox):  # type: ignore[no-untyped-def]
    for call in (
        lambda: provider.open_pty(sandbox),
        lambda: provider.stats(sandbox),
        lambda: provider.start_process(sandbox, "true"),
        lambda: provider.connect_port(sandbox, 80),
        lambda: provider.watch(sandbox, ""),
    ):
        with pytest.raises(CapabilityNotSupported):
            call()
