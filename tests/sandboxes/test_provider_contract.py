"""The provider contract: every provider (local, docker, ...) must pass these unchanged.

Written only against the `provider` and `sandbox` fixtures. Waiting is done by
polling with deadlines; nothing asserts on wall-clock durations.
"""

from __future__ import annotations

import select
import signal
import threading
import time
import uuid
from collections.abc import Callable
from typing import TypeVar

import pytest

from sandboxes.providers.base import (
    Capability,
    ExecRequest,
    FileEvent,
    FileNotFound,
    PathNotAllowed,
    PtySession,
    SandboxGone,
    SandboxProvider,
    SandboxSpec,
    SandboxState,
)
from tests.sandboxes.snippets import run_code

T = TypeVar("T")
DEADLINE_S = 20.0


def wait_for(fn: Callable[[], T | None], timeout: float = DEADLINE_S, every: float = 0.05) -> T:
    """Call fn until it returns something truthy; fail after `timeout` seconds."""
    end = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > end:
            pytest.fail(f"condition not met within {timeout}s")
        time.sleep(every)


def needs(provider: SandboxProvider, capability: Capability) -> None:
    """A provider that lacks `capability` must replace this test with one showing that it
    refuses the operation (see tests/cloud/test_shell_layer_contract.py)."""
    if capability not in provider.capabilities:
        pytest.fail(f"{provider.name} lacks {capability.value}: override this contract test")


def sh(provider: SandboxProvider, sandbox: str, command: str, **kw):  # type: ignore[no-untyped-def]
    return provider.exec(sandbox, ExecRequest(command=command, **kw))


# ---------------------------------------------------------------------------
# exec
# ---------------------------------------------------------------------------


def test_exec_shell_string_captures_streams_and_exit_code(provider, sandbox):
    result = sh(provider, sandbox, "echo hello; echo oops >&2; exit 3")
    assert result.stdout == b"hello\n"
    assert result.stderr == b"oops\n"
    assert result.exit_code == 3
    assert not result.timed_out
    assert not result.truncated
    assert result.duration_ms >= 0


def test_exec_args_form_does_not_use_a_shell(provider, sandbox):
    result = provider.exec(sandbox, ExecRequest(command="printf", args=["%s|%s", "a b", "$HOME"]))
    assert result.exit_code == 0
    assert result.stdout == b"a b|$HOME"


def test_exec_passes_stdin(provider, sandbox):
    result = provider.exec(sandbox, ExecRequest(command="cat", args=[], stdin=b"line1\nline2\0bin"))
    assert result.stdout == b"line1\nline2\0bin"


def test_exec_cwd_is_relative_to_workspace(provider, sandbox):
    provider.write_file(sandbox, "sub/dir/marker.txt", b"here")
    result = sh(provider, sandbox, "pwd; cat marker.txt", cwd="sub/dir")
    lines = result.stdout.decode().splitlines()
    assert lines[0].endswith("/sub/dir")
    assert lines[1] == "here"


def test_exec_env_is_passed(provider, sandbox):
    result = sh(provider, sandbox, 'echo "$GREETING"', env={"GREETING": "hi there"})
    assert result.stdout == b"hi there\n"


@pytest.mark.parametrize(("command", "code"), [("true", 0), ("exit 7", 7), ("kill -TERM $$", -15)])
def test_exec_exit_codes(provider, sandbox, command, code):
    assert sh(provider, sandbox, command).exit_code == code


def test_exec_missing_binary_fails_without_raising(provider, sandbox):
    result = provider.exec(sandbox, ExecRequest(command="/no/such/binary", args=[]))
    assert result.exit_code != 0


def test_exec_timeout_kills_the_whole_tree(provider, sandbox):
    needs(provider, Capability.TIMEOUT)
    result = sh(provider, sandbox, "sleep 100 & sleep 100", timeout_s=1)
    assert result.timed_out
    assert result.exit_code == -9

    def no_sleepers() -> bool:
        listing = sh(
            provider,
            sandbox,
            "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done",
        ).stdout
        return b"sleep 100" not in listing

    wait_for(no_sleepers)


def test_exec_output_is_truncated_with_flag(provider, sandbox):
    result = sh(provider, sandbox, "head -c 5000 /dev/zero; echo small >&2", max_output_bytes=1000)
    assert len(result.stdout) == 1000
    assert result.stdout_truncated
    assert not result.stderr_truncated
    assert result.stderr == b"small\n"
    assert result.truncated


# ---------------------------------------------------------------------------
# run_code: not a provider method; the services build it from the language table over exec
# (sandboxes/code_runs.py). These prove every provider's exec carries it.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("language", "code"),
    [
        ("python", "import sys\nprint(sum(range(5)), file=sys.stdout)"),
        ("bash", "x=4; echo $((x+6))"),
        ("node", "console.log([1, 2, 3].reduce((a, b) => a + b) + 4)"),
    ],
)
def test_run_code_languages(provider, sandbox, language, code):
    needs(provider, Capability.EXEC)
    result = run_code(provider, sandbox, code, language)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == b"10"


def test_run_code_python_reads_stdin(provider, sandbox):
    needs(provider, Capability.EXEC)
    result = run_code(provider, sandbox, "print(input()[::-1])", "python", stdin=b"abc\n")
    assert result.stdout == b"cba\n"


def test_run_code_long_python_goes_through_a_file(provider, sandbox):
    needs(provider, Capability.EXEC)
    code = "x = 1\n" + "#" * 120_000 + "\nprint(x + 1)"  # beyond one argument's limit
    result = run_code(provider, sandbox, code, "python")
    assert (result.exit_code, result.stdout) == (0, b"2\n"), result.stderr


# ---------------------------------------------------------------------------
# files
# ---------------------------------------------------------------------------


def test_write_then_read_binary_with_offset_and_length(provider, sandbox):
    needs(provider, Capability.FILES)
    data = bytes(range(256)) * 4
    entry = provider.write_file(sandbox, "data/blob.bin", data)
    assert entry.type == "file"
    assert entry.size == len(data)
    assert entry.path == "data/blob.bin"
    assert entry.name == "blob.bin"
    assert provider.read_file(sandbox, "data/blob.bin") == data
    assert provider.read_file(sandbox, "data/blob.bin", offset=10, length=5) == data[10:15]
    assert provider.read_file(sandbox, "data/blob.bin", offset=1000) == data[1000:]
    # visible to commands too
    assert sh(provider, sandbox, "wc -c < data/blob.bin").stdout.strip() == b"1024"


def test_file_written_by_command_is_readable(provider, sandbox):
    sh(provider, sandbox, "echo made-inside > inside.txt")
    assert provider.read_file(sandbox, "inside.txt") == b"made-inside\n"
    assert provider.read_file(sandbox, "/workspace/inside.txt") == b"made-inside\n"


def test_mkdir_list_stat_exists(provider, sandbox):
    needs(provider, Capability.FILES)
    assert provider.mkdir(sandbox, "a/b/c").type == "dir"
    assert provider.mkdir(sandbox, "a/b/c").type == "dir"  # idempotent
    provider.write_file(sandbox, "a/top.txt", b"1")
    provider.write_file(sandbox, "a/b/c/deep.txt", b"22")

    flat = {e.path: e for e in provider.list_files(sandbox, "a")}
    assert set(flat) == {"a/b", "a/top.txt"}
    assert flat["a/b"].type == "dir"
    assert flat["a/top.txt"].size == 1

    deep = {e.path for e in provider.list_files(sandbox, "a", recursive=True)}
    assert deep == {"a/b", "a/b/c", "a/b/c/deep.txt", "a/top.txt"}

    st = provider.stat(sandbox, "a/b/c/deep.txt")
    assert (st.type, st.size, st.name) == ("file", 2, "deep.txt")
    assert st.mtime > 0
    assert provider.exists(sandbox, "a/b")
    assert not provider.exists(sandbox, "a/nope")


def test_remove_and_move(provider, sandbox):
    needs(provider, Capability.FILES)
    provider.write_file(sandbox, "tree/x/y.txt", b"y")
    provider.write_file(sandbox, "lone.txt", b"l")
    provider.remove(sandbox, "lone.txt")
    assert not provider.exists(sandbox, "lone.txt")
    provider.remove(sandbox, "tree", recursive=True)
    assert not provider.exists(sandbox, "tree")

    provider.write_file(sandbox, "old.txt", b"move me")
    moved = provider.move(sandbox, "old.txt", "new/place.txt")
    assert moved.path == "new/place.txt"
    assert not provider.exists(sandbox, "old.txt")
    assert provider.read_file(sandbox, "new/place.txt") == b"move me"


@pytest.mark.parametrize(
    "op",
    [
        lambda p, s: p.read_file(s, "missing.txt"),
        lambda p, s: p.stat(s, "missing/deeper.txt"),
        lambda p, s: p.list_files(s, "missing-dir"),
        lambda p, s: p.remove(s, "missing.txt"),
        lambda p, s: p.move(s, "missing.txt", "elsewhere.txt"),
    ],
    ids=["read", "stat", "list", "remove", "move"],
)
def test_missing_file_raises_file_not_found(provider, sandbox, op):
    needs(provider, Capability.FILES)
    with pytest.raises(FileNotFound):
        op(provider, sandbox)


@pytest.mark.parametrize(
    "path", ["../../etc/passwd", "/etc/passwd", "a/../../etc/passwd", "/workspace/../etc/passwd"]
)
def test_paths_outside_the_workspace_are_refused(provider, sandbox, path):
    needs(provider, Capability.FILES)
    with pytest.raises(PathNotAllowed):
        provider.read_file(sandbox, path)
    with pytest.raises(PathNotAllowed):
        provider.write_file(sandbox, path, b"pwned")


def test_malformed_paths_are_refused(provider, sandbox):
    needs(provider, Capability.FILES)
    with pytest.raises(PathNotAllowed):
        provider.read_file(sandbox, "nul\0byte")
    with pytest.raises(PathNotAllowed):
        provider.write_file(sandbox, "x" * 5000, b"long")


def test_symlinks_out_of_the_workspace_are_refused(provider, sandbox):
    needs(provider, Capability.FILES)
    result = sh(provider, sandbox, "ln -s / rootlink && ln -s /etc etclink && ln -s ../.. up")
    assert result.exit_code == 0, result.stderr
    for path in ("rootlink/etc/passwd", "etclink/passwd", "up/etc/passwd"):
        with pytest.raises(PathNotAllowed):
            provider.read_file(sandbox, path)
        with pytest.raises(PathNotAllowed):
            provider.write_file(sandbox, path, b"pwned")
    with pytest.raises(PathNotAllowed):
        provider.list_files(sandbox, "etclink")


def test_symlink_inside_the_workspace_is_followed(provider, sandbox):
    needs(provider, Capability.FILES)
    provider.write_file(sandbox, "real/file.txt", b"content")
    sh(provider, sandbox, "ln -s real alias")
    assert provider.read_file(sandbox, "alias/file.txt") == b"content"


# ---------------------------------------------------------------------------
# processes
# ---------------------------------------------------------------------------


def test_background_process_start_list_signal(provider, sandbox):
    needs(provider, Capability.PROCESSES)
    info = provider.start_process(sandbox, "sleep", args=["300"])
    assert info.running

    def listed():  # type: ignore[no-untyped-def]
        return next((p for p in provider.list_processes(sandbox) if p.pid == info.pid), None)

    assert wait_for(listed).running
    provider.signal_process(sandbox, info.pid, signal.SIGTERM)

    def stopped() -> bool:
        current = listed()
        return current is None or not current.running

    wait_for(stopped)


# ---------------------------------------------------------------------------
# lifecycle
# ---------------------------------------------------------------------------


def test_get_list_destroy_lifecycle(provider):
    handle = provider.create(SandboxSpec(sandbox_id=uuid.uuid4().hex, labels={"k": "v"}))
    try:
        assert handle.state == SandboxState.RUNNING
        got = provider.get(handle.provider_id)
        assert got.state == SandboxState.RUNNING
        assert handle.provider_id in {h.provider_id for h in provider.list_sandboxes()}
    finally:
        assert provider.destroy(handle.provider_id) is True
    assert provider.destroy(handle.provider_id) is False
    with pytest.raises(SandboxGone):
        provider.get(handle.provider_id)
    with pytest.raises(SandboxGone):
        provider.exec(handle.provider_id, ExecRequest(command="true"))
    assert handle.provider_id not in {h.provider_id for h in provider.list_sandboxes()}


def test_stats_fields_are_sane(provider, sandbox):
    needs(provider, Capability.STATS)
    provider.write_file(sandbox, "big.bin", b"x" * 200_000)
    stats = provider.stats(sandbox)
    assert stats.cpu_percent >= 0
    assert stats.memory_bytes >= 0
    assert stats.disk_bytes >= 200_000
    assert stats.net_rx_bytes >= 0
    assert stats.net_tx_bytes >= 0
    assert stats.uptime_s >= 0
    assert stats.process_count >= 0


# ---------------------------------------------------------------------------
# real-time: terminal, ports, watch
# ---------------------------------------------------------------------------


PROMPT = (b"$ ", b"# ")
"""How a shell's prompt ends: a user's, root's (the cloud fakes run as root)."""


def read_pty_until(
    pty: PtySession,
    needle: bytes | tuple[bytes, ...],
    timeout: float = DEADLINE_S,
    *,
    after: bytes = b"",
) -> bytes:
    """Read until `needle` (or any of several) appears, after `after` when given."""
    needles = needle if isinstance(needle, tuple) else (needle,)
    seen = b""
    end = time.monotonic() + timeout
    while not any(n in (seen.partition(after)[2] if after else seen) for n in needles):
        remaining = end - time.monotonic()
        if remaining <= 0:
            pytest.fail(f"{needle!r} not seen in terminal output {seen[-500:]!r}")
        select.select([pty.fileno()], [], [], min(remaining, 0.5))
        try:
            chunk = pty.read()
        except BlockingIOError:
            continue
        if chunk == b"":
            pytest.fail(f"terminal ended before {needle!r}: {seen[-500:]!r}")
        seen += chunk
    return seen


def test_pty_echo_resize_close(provider, sandbox):
    needs(provider, Capability.PTY)
    pty = provider.open_pty(sandbox, cols=80, rows=24)
    try:
        pty.write(b"echo $((40+2))\n")
        # The prompt after the output, not the output alone: as readline prepares the
        # terminal for the next line it reads the window size and writes it back (GNU
        # readline's set_winsize), which undoes a resize landing in between.
        read_pty_until(pty, PROMPT, after=b"42")
        assert pty.exit_code() is None
        pty.resize(cols=100, rows=40)
        pty.write(b"stty size\n")
        read_pty_until(pty, b"40 100")
    finally:
        pty.close()
    pty.close()  # idempotent


def test_pty_reports_exit_code(provider, sandbox):
    needs(provider, Capability.PTY)
    pty = provider.open_pty(sandbox)
    try:
        pty.write(b"exit 5\n")
        wait_for(lambda: pty.exit_code() is not None)
        assert pty.exit_code() == 5
    finally:
        pty.close()


def test_open_ports_and_connect_port(provider, sandbox):
    needs(provider, Capability.PORTS)
    provider.write_file(sandbox, "site/index.html", b"<h1>sandpit</h1>")
    provider.start_process(
        sandbox, "python3", args=["-m", "http.server", "8123", "--bind", "127.0.0.1"], cwd="site"
    )
    wait_for(lambda: any(p.port == 8123 for p in provider.open_ports(sandbox)))
    stream = provider.connect_port(sandbox, 8123)
    try:
        stream.sendall(b"GET /index.html HTTP/1.0\r\nHost: localhost\r\n\r\n")
        response = b""
        while True:
            chunk = stream.recv(65536)
            if not chunk:
                break
            response += chunk
    finally:
        stream.close()
    assert response.startswith(b"HTTP/1.0 200")
    assert b"<h1>sandpit</h1>" in response


def test_watch_reports_created_file(provider, sandbox):
    needs(provider, Capability.WATCH)
    provider.mkdir(sandbox, "watched")
    events: list[FileEvent] = []
    stop = threading.Event()
    watcher = provider.watch(sandbox, "watched")

    def consume() -> None:
        for batch in watcher:
            events.extend(batch)
            if stop.is_set():
                break

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    try:
        # Keep creating files until one is reported: some providers need a moment to arm.
        def created() -> bool:
            name = f"f{uuid.uuid4().hex[:8]}.txt"
            sh(provider, sandbox, f"echo hi > watched/{name}")
            end = time.monotonic() + 1.0
            while time.monotonic() < end:
                if any(e.type == "created" and e.path == f"watched/{name}" for e in events):
                    return True
                time.sleep(0.02)
            return False

        wait_for(created)
    finally:
        stop.set()
        sh(provider, sandbox, "touch watched/wake-up")
        thread.join(timeout=5)
        watcher.close()  # type: ignore[attr-defined]
