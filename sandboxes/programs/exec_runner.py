"""Runs one command inside a sandbox and streams it back as framed lines on its PTY.

The exec WebSocket (sandboxes/realtime/exec.py) opens a PTY in the sandbox (the one live
stream every provider offers) and starts this file there as
`python3 -I -S -c "$SANDPIT_RUNNER"`, the command described by the JSON in $SANDPIT_EXEC
(argv, cwd, env, timeout_s). The PTY is switched to raw mode; the command runs on pipes, so
stdout and stderr stay apart. Standard library only: it runs on whatever image the sandbox
has.

Out, after READY_MARK, one line per frame, "<kind> <base64>\\n": O stdout, E stderr,
S started (the pid), X exit code, T exit code after the timeout killed it.
In: I <base64> stdin data, C close stdin, K <signal> signal the command's process group.
End of input (the PTY closed) kills the process group.
"""

from __future__ import annotations

import base64
import json
import os
import select
import subprocess
import sys
import time
import tty

READY_MARK = b"\x1e\x1eSANDPIT-READY\n"
"""Written once raw mode is on: what the PTY echoed before it is the launch line, not output."""
READ_BYTES = 65536


def emit(kind: bytes, data: bytes = b"") -> None:
    """Write one frame to the PTY, whole (os.write may write part of it)."""
    view = memoryview(kind + b" " + base64.b64encode(data) + b"\n")
    while view:
        view = view[os.write(1, view) :]


def kill_group(pid: int, signal_number: int = 9) -> None:
    try:
        os.killpg(pid, signal_number)
    except OSError:
        pass  # already gone


def handle_input(process: subprocess.Popen[bytes], line: bytes) -> None:
    """Act on one input frame."""
    kind, _, payload = line.partition(b" ")
    if kind == b"I" and process.stdin:
        try:
            process.stdin.write(base64.b64decode(payload))
            process.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass  # the command closed its stdin; the data has nowhere to go
    elif kind == b"C" and process.stdin:
        try:
            process.stdin.close()
        except OSError:
            pass
    elif kind == b"K":
        kill_group(process.pid, int(payload or 9))


def main() -> int:
    spec = json.loads(os.environ.pop("SANDPIT_EXEC"))
    os.environ.pop("SANDPIT_RUNNER", None)
    try:
        tty.setraw(0)
    except Exception:  # noqa: BLE001, S110 - stdin is not a terminal (pipes): nothing to set
        pass
    os.write(1, READY_MARK)
    env = dict(os.environ)
    env.update(spec.get("env") or {})
    try:
        process = subprocess.Popen(  # noqa: S603 - the sandbox's own user asked for this command
            spec["argv"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=spec.get("cwd") or None,
            env=env,
            start_new_session=True,
        )
    except OSError as exc:
        emit(b"E", (str(exc) + "\n").encode())
        emit(b"X", b"127")
        return 0
    emit(b"S", str(process.pid).encode())
    assert process.stdout is not None and process.stderr is not None
    outputs = {process.stdout.fileno(): b"O", process.stderr.fileno(): b"E"}
    pending = b""
    reading_input = True
    timeout_s = spec.get("timeout_s")
    deadline = time.monotonic() + timeout_s if timeout_s else None
    timed_out = False
    while outputs:
        wait_s = None if deadline is None else max(0, deadline - time.monotonic())
        watched = list(outputs) + ([0] if reading_input else [])
        ready, _, _ = select.select(watched, [], [], wait_s)
        if not ready and deadline is not None and time.monotonic() >= deadline:
            kill_group(process.pid)
            timed_out = True
            deadline = None
        for fd in ready:
            if fd == 0:
                data = os.read(0, READ_BYTES)
                if not data:
                    kill_group(process.pid)
                    reading_input = False
                    continue
                pending += data
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    handle_input(process, line)
            else:
                data = os.read(fd, READ_BYTES)
                if data:
                    emit(outputs[fd], data)
                else:
                    del outputs[fd]
    code = process.wait()
    emit(b"T" if timed_out else b"X", str(code).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
