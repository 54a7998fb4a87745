"""The streamed-run program (sandboxes/programs/exec_runner.py), run as the sandbox runs it
(`python3 -I -S -c <source>`), here on pipes instead of a PTY: frames out, frames in."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys

from sandboxes.programs import exec_runner
from sandboxes.streaming import EXEC_RUNNER_SOURCE


def start(spec: dict[str, object]) -> subprocess.Popen[bytes]:
    env = {**os.environ, "SANDPIT_EXEC": json.dumps(spec), "SANDPIT_RUNNER": "x"}
    return subprocess.Popen(  # noqa: S603 - our own program
        [sys.executable, "-I", "-S", "-c", EXEC_RUNNER_SOURCE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )


def run(
    spec: dict[str, object], stdin: bytes = b"", close_input: bool = False
) -> list[tuple[bytes, bytes]]:
    """Run to the exit frame. Input stays open unless `close_input` (its end kills the
    command, as a closed PTY does)."""
    proc = start(spec)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(stdin)
    proc.stdin.flush()
    if close_input:
        proc.stdin.close()
    assert proc.stdout.read(len(exec_runner.READY_MARK)) == exec_runner.READY_MARK
    frames = []
    while not frames or frames[-1][0] not in (b"X", b"T"):
        line = proc.stdout.readline()
        assert line, frames
        kind, _, payload = line.rstrip(b"\n").partition(b" ")
        frames.append((kind, base64.b64decode(payload)))
    if not proc.stdin.closed:
        proc.stdin.close()
    assert proc.wait(timeout=30) == 0
    return frames


def joined(frames: list[tuple[bytes, bytes]], kind: bytes) -> bytes:
    return b"".join(data for k, data in frames if k == kind)


def test_stdout_and_stderr_stay_apart_and_the_exit_code_comes_last() -> None:
    frames = run({"argv": ["sh", "-c", "echo out; echo err >&2; exit 3"]})
    assert frames[0][0] == b"S" and int(frames[0][1]) > 0
    assert joined(frames, b"O") == b"out\n"
    assert joined(frames, b"E") == b"err\n"
    assert frames[-1] == (b"X", b"3")


def test_stdin_frames_reach_the_command_and_close_ends_its_input() -> None:
    data = base64.b64encode(b"hello\n")
    frames = run({"argv": ["cat"]}, stdin=b"I " + data + b"\nC \n")
    assert joined(frames, b"O") == b"hello\n"
    assert frames[-1] == (b"X", b"0")


def test_the_end_of_input_kills_the_command() -> None:
    frames = run({"argv": ["sleep", "30"]}, close_input=True)
    assert frames[-1] == (b"X", b"-9")


def test_a_signal_frame_signals_the_process_group() -> None:
    # The trap prints only once the shell is running, then waits for the signal.
    script = "trap 'echo got-term; exit 7' TERM; echo ready; while :; do sleep 0.05; done"
    proc = start({"argv": ["sh", "-c", script]})
    assert proc.stdin is not None and proc.stdout is not None
    seen = b""
    while b"O " + base64.b64encode(b"ready\n") not in seen:
        chunk = proc.stdout.readline()
        assert chunk, seen
        seen += chunk
    proc.stdin.write(b"K 15\n")
    proc.stdin.flush()
    rest = b""
    while b"X " not in rest:
        line = proc.stdout.readline()
        assert line, rest
        rest += line
    proc.stdin.close()
    proc.wait(timeout=30)
    assert base64.b64encode(b"got-term\n") in rest
    assert rest.endswith(b"X " + base64.b64encode(b"7") + b"\n")


def test_the_timeout_kills_the_command_and_says_so() -> None:
    frames = run({"argv": ["sh", "-c", "echo started; exec sleep 30"], "timeout_s": 0.3})
    assert joined(frames, b"O") == b"started\n"
    assert frames[-1] == (b"T", b"-9")


def test_a_command_that_cannot_start_reports_127() -> None:
    frames = run({"argv": ["/no/such/program"]})
    assert b"No such file" in joined(frames, b"E")
    assert frames[-1] == (b"X", b"127")


def test_env_and_cwd_are_applied(tmp_path) -> None:  # type: ignore[no-untyped-def]
    frames = run(
        {
            "argv": ["sh", "-c", "echo $GREETING; pwd"],
            "env": {"GREETING": "hi"},
            "cwd": str(tmp_path),
        }
    )
    assert joined(frames, b"O") == f"hi\n{tmp_path}\n".encode()
