"""Processes in a sandbox, one service each (counted once; see services.py): background
processes, background commands whose output is kept, signals."""

from __future__ import annotations

import shlex
import signal as signal_module
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from django.conf import settings

from common.errors import ApplicationError

from .activity import sandbox_touch
from .caller import Caller, metered
from .models import Sandbox
from .provider_access import provider_call, provider_for, require_capability, require_running
from .providers.base import Capability, ExecRequest, ProcessInfo, ProcessNotFound, SandboxProvider


def _processes(sandbox: Sandbox) -> SandboxProvider:
    require_running(sandbox)
    provider = provider_for(sandbox)
    require_capability(provider, Capability.PROCESSES)
    return provider


def sandbox_process_start(
    *,
    caller: Caller,
    sandbox: Sandbox,
    command: str,
    args: Sequence[str] | None = None,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
) -> ProcessInfo:
    """Start a background process (counted once)."""
    with metered(caller, feature="processes", operation="process.start", scope="exec"):
        provider = _processes(sandbox)
        info = provider_call(
            sandbox,
            provider.start_process,
            sandbox.provider_id,
            command,
            list(args) if args is not None else None,
            cwd,
            dict(env or {}),
        )
    sandbox_touch(sandbox)
    return info


def sandbox_process_list(*, caller: Caller, sandbox: Sandbox) -> list[ProcessInfo]:
    """The sandbox's processes (counted once: it runs a listing inside the sandbox)."""
    with metered(caller, feature="processes", operation="process.list", scope="exec"):
        provider = _processes(sandbox)
        processes = provider_call(sandbox, provider.list_processes, sandbox.provider_id)
    return [replace(p, command=_shown_command(p.command)) for p in processes]


# --- background commands ---------------------------------------------------------------------

BACKGROUND_LOG_DIR = "/tmp/.sandpit/processes"
"""Where a background command's stdout and stderr go, as <pid>.out and <pid>.err. The
providers' agents discard a started process's output, so the command redirects its own:
`$$` is the shell's pid, which `exec` hands on to the program, so the file names match the
pid the API returns. In /tmp, not the workspace, so listings and watchers never see them."""
_LOG_PREFIX = (
    f"mkdir -p {BACKGROUND_LOG_DIR} && "
    f"exec >{BACKGROUND_LOG_DIR}/$$.out 2>{BACKGROUND_LOG_DIR}/$$.err </dev/null\n"
)
_READ_LOGS = (
    f'd={BACKGROUND_LOG_DIR}; [ -e "$d/$1.out" ] || exit 3; '
    'tail -c +"$(($2 + 1))" "$d/$1.out" | head -c "$4"; '
    'tail -c +"$(($3 + 1))" "$d/$1.err" 2>/dev/null | head -c "$4" >&2'
)


def _shown_command(command: str) -> str:
    """A background command as its caller wrote it (without the output redirection)."""
    if not command.startswith(_LOG_PREFIX):
        return command
    shown = command[len(_LOG_PREFIX) :]
    return shown[len("exec ") :] if shown.startswith("exec ") else shown


def sandbox_exec_background(
    *,
    caller: Caller,
    sandbox: Sandbox,
    command: str,
    args: Sequence[str] | None = None,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
) -> ProcessInfo:
    """Start a command in the background and return at once (counted once, as a command).
    Its stdout and stderr are kept in the sandbox (BACKGROUND_LOG_DIR) for
    `sandbox_background_output`; it runs until it exits, is signalled or the sandbox ends.
    `args is None` runs `command` under `sh -c`."""
    body = command if args is None else "exec " + shlex.join([command, *args])
    with metered(caller, feature="exec", operation="command", scope="exec"):
        provider = _processes(sandbox)
        info = provider_call(
            sandbox,
            provider.start_process,
            sandbox.provider_id,
            _LOG_PREFIX + body,
            None,
            cwd,
            dict(env or {}),
        )
    sandbox_touch(sandbox)
    return replace(info, command=_shown_command(info.command))


@dataclass(frozen=True)
class BackgroundOutput:
    """What a background command wrote since the offsets asked for."""

    stdout: bytes
    stderr: bytes
    process: ProcessInfo | None
    """Its state (running, exit code) when the sandbox still lists it."""


def sandbox_background_output(
    *,
    caller: Caller,
    sandbox: Sandbox,
    pid: int,
    stdout_offset: int = 0,
    stderr_offset: int = 0,
) -> BackgroundOutput:
    """Up to SANDPIT_MAX_OUTPUT_BYTES per stream of a background command's output, from
    the given byte offsets (a poller passes what it has read so far); counted once. Raises
    ProcessNotFound when `pid` was not started as a background command."""
    limit = settings.SANDPIT_MAX_OUTPUT_BYTES
    with metered(caller, feature="processes", operation="process.output", scope="exec"):
        provider = _processes(sandbox)
        # State first, output second: an answer saying it has exited then holds all it wrote.
        processes = provider_call(sandbox, provider.list_processes, sandbox.provider_id)
        request = ExecRequest(
            command="/bin/sh",
            args=[
                "-c",
                _READ_LOGS,
                "sh",
                str(pid),
                str(stdout_offset),
                str(stderr_offset),
                str(limit),
            ],
            timeout_s=30.0,
            max_output_bytes=limit,
        )
        result = provider_call(sandbox, provider.exec, sandbox.provider_id, request)
        found = next((p for p in processes if p.pid == pid), None)
        ours = found is not None and found.command.startswith(_LOG_PREFIX)
        if result.exit_code == 3 and not ours:
            raise ProcessNotFound(f"No background command with pid {pid} kept its output.")
    if found is not None:
        found = replace(found, command=_shown_command(found.command))
    if result.exit_code == 3:
        # Just started: its shell has not opened the log yet, so nothing was written.
        return BackgroundOutput(stdout=b"", stderr=b"", process=found)
    return BackgroundOutput(stdout=result.stdout, stderr=result.stderr, process=found)


def parse_signal(name: str | int) -> int:
    """A signal number from a name ('TERM', 'SIGTERM') or number; ApplicationError (400)."""
    if isinstance(name, int):
        number = name
    else:
        text = name.upper().strip()
        if text.isdigit():
            number = int(text)
        else:
            if not text.startswith("SIG"):
                text = "SIG" + text
            member = getattr(signal_module.Signals, text, None)
            if member is None:
                raise ApplicationError(f"Unknown signal '{name}'.", code="validation_error")
            number = int(member)
    if number not in {int(s) for s in signal_module.Signals}:
        raise ApplicationError(f"Unknown signal '{name}'.", code="validation_error")
    return number


def sandbox_process_signal(
    *, caller: Caller, sandbox: Sandbox, pid: int, signal: str | int
) -> None:
    """Send a signal to a process (counted once). Only SIGKILL stops a process whatever it
    does, so only SIGKILL is never refused by billing: a catchable signal could be a trigger
    for more work, so it stays an ordinary metered operation."""
    number = parse_signal(signal)
    with metered(
        caller,
        feature="processes",
        operation="process.signal",
        scope="exec",
        teardown=number == signal_module.SIGKILL,
    ):
        provider = _processes(sandbox)
        provider_call(sandbox, provider.signal_process, sandbox.provider_id, pid, number)
    sandbox_touch(sandbox)
