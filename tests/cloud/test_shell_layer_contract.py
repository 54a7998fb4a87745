"""The provider contract against the shared shell layer (cloud/shell.py) on a local `sh`.

Modal, Daytona, Runloop, Vercel and Blaxel build exec and files on this layer;
their own SDK calls (`_shell` and lifecycle) cannot run here. The contract's tests of
capabilities the layer does not declare (processes, terminals, ports, watch, stats) are
replaced below by checks that it refuses them.
"""

from __future__ import annotations

import os
import shutil
import uuid

import pytest

from sandboxes.code_runs import INLINE_CODE_BYTES
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


@pytest.mark.parametrize(("command", "code"), [("true", 0), ("exit 7", 7)])
def test_exec_exit_codes(provider, sandbox, command, code):  # type: ignore[no-untyped-def]
    contract.test_exec_exit_codes(provider, sandbox, command, code)


def test_signal_death_is_reported_as_128_plus_the_signal(provider, sandbox):  # type: ignore[no-untyped-def]
    # Unlike local and docker (-N), the shell layer only sees the shell's own status: 128+N.
    assert provider.exec(sandbox, ExecRequest(command="kill -TERM $$")).exit_code == 128 + 15


def test_exec_timeout_kills_the_whole_tree(provider, sandbox):  # type: ignore[no-untyped-def]
    # The layer kills the command's process group (no process listing to check beyond it).
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


# The contract's tests of capabilities this layer does not declare, replaced by what it
# must do instead: refuse with CapabilityNotSupported (501 through the API).


def test_background_process_start_list_signal(provider, sandbox):  # type: ignore[no-untyped-def]
    with pytest.raises(CapabilityNotSupported):
        provider.start_process(sandbox, "true")


def test_stats_fields_are_sane(provider, sandbox):  # type: ignore[no-untyped-def]
    with pytest.raises(CapabilityNotSupported):
        provider.stats(sandbox)


def test_pty_echo_resize_close(provider, sandbox):  # type: ignore[no-untyped-def]
    with pytest.raises(CapabilityNotSupported):
        provider.open_pty(sandbox)


def test_pty_reports_exit_code(provider, sandbox):  # type: ignore[no-untyped-def]
    with pytest.raises(CapabilityNotSupported):
        provider.open_pty(sandbox, cols=100, rows=30, cwd="sub")


def test_open_ports_and_connect_port(provider, sandbox):  # type: ignore[no-untyped-def]
    with pytest.raises(CapabilityNotSupported):
        provider.open_ports(sandbox)
    with pytest.raises(CapabilityNotSupported):
        provider.connect_port(sandbox, 80)


def test_watch_reports_created_file(provider, sandbox):  # type: ignore[no-untyped-def]
    with pytest.raises(CapabilityNotSupported):
        provider.watch(sandbox, "")


def test_run_code_long_python_goes_through_a_file(provider, sandbox):  # type: ignore[no-untyped-def]
    """The stand-in's `_shell` hands the whole script to `sh` as one argument (at most 128 KiB,
    stdin base64-encoded inside it), so code past the inline limit cannot reach it here; the
    cloud SDKs send the script over HTTP. The longest inline snippet runs."""
    code = "x = 1\n" + "#" * (INLINE_CODE_BYTES - 100) + "\nprint(x + 1)"
    result = contract.run_code(provider, sandbox, code, "python")
    assert (result.exit_code, result.stdout) == (0, b"2\n"), result.stderr
