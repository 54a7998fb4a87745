"""Run by test_inherited_signals.py under tests/unfriendly_launch.py (SIGINT and SIGQUIT
ignored, SIGCHLD blocked): starts a local provider of its own and reports, as one JSON
object on stdout, the signal state of what runs in a sandbox on every start path, and
whether a real Ctrl-C in a terminal interrupts a foreground job.

    python -m tests.sandboxes.signals_probe JAIL_ROOT
"""

from __future__ import annotations

import json
import select
import sys
import time
import uuid
from pathlib import Path

from sandboxes.providers.base import ExecRequest, PtySession, SandboxSpec
from sandboxes.providers.local import LocalProvider
from tests.sandboxes.snippets import run_code

SIG_LINES = "grep -E '^Sig(Ign|Blk):' /proc/self/status"


def _read_until(term: PtySession, marker: bytes, timeout_s: float = 10.0) -> bytes:
    out = b""
    deadline = time.monotonic() + timeout_s
    while marker not in out and time.monotonic() < deadline:
        select.select([term.fileno()], [], [], 0.2)
        try:
            out += term.read()
        except BlockingIOError:
            continue
    return out


def _parse(text: str) -> dict[str, str]:
    fields = {}
    for line in text.splitlines():
        if line.startswith(("SigIgn:", "SigBlk:")):
            name, value = line.split(":", 1)
            fields[name] = value.strip()
    return fields


def main() -> None:
    provider = LocalProvider(root_dir=Path(sys.argv[1]), warm_pool=1)
    report: dict[str, object] = {}
    sandbox = provider.create(SandboxSpec(sandbox_id=uuid.uuid4().hex)).provider_id
    try:
        run = provider.exec
        # argv in the workspace: posix_spawn; a shell string with another cwd: fork+exec.
        report["spawned"] = _parse(
            run(
                sandbox, ExecRequest(command="grep", args=["^Sig", "/proc/self/status"])
            ).stdout.decode()
        )
        report["forked"] = _parse(
            run(sandbox, ExecRequest(command=SIG_LINES, cwd="/tmp")).stdout.decode()
        )
        # Python ignores SIGPIPE and SIGXFSZ itself, so the code probe is a shell.
        report["code"] = _parse(run_code(provider, sandbox, SIG_LINES, "bash").stdout.decode())
        provider.start_process(sandbox, "sh", ["-c", f"{SIG_LINES} > /workspace/bg.txt"])
        deadline = time.monotonic() + 10
        while not provider.exists(sandbox, "bg.txt") and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        report["background"] = _parse(provider.read_file(sandbox, "bg.txt").decode())
        term = provider.open_pty(sandbox)
        try:
            # A command of the shell's (interactive bash ignores SIGTERM and the job
            # control signals itself, and restores what it inherited for its children).
            term.write(f"{SIG_LINES}; echo probe-$((1+1))\n".encode())
            report["terminal"] = _parse(_read_until(term, b"probe-2\r\n").decode(errors="replace"))
            term.write(b"sh -c 'echo running-$((6*7)); exec sleep 100'\n")
            _read_until(term, b"running-42")
            started = time.monotonic()
            term.write(b"\x03")
            term.write(b"echo after$((2+3))\n")
            report["ctrl_c_worked"] = b"after5" in _read_until(term, b"after5", 5.0)
            report["ctrl_c_s"] = time.monotonic() - started
        finally:
            term.close()
    finally:
        provider.destroy(sandbox)
        provider.close()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
