"""Several web server processes on one port (``SANDPIT_WEB_PROCESSES`` or ``--processes``).

One Python process runs the event loop and the GIL of one daphne; a machine with more
cores serves more with more processes. The supervisor (``python -m playground.webserver
--processes N -b HOST -p PORT APP``) binds one listening socket per process, each with
SO_REUSEPORT on the same address, and starts each daphne on its own (``--fd``): the
kernel spreads new connections over them by a hash of the connection, so a burst spreads
evenly, and a process busy with a long request does not hold back the others' accepts (a
single shared socket would wake every process for every connection). All bind errors surface once, in the supervisor, before any process starts.

When one process exits, the supervisor stops the others and exits with its status: the
service manager (``make run``, the container) restarts everything or reports the failure.
A supervisor killed outright takes its servers along (PR_SET_PDEATHSIG).

Each process keeps its own database pool, warm pool of jails and request threads; nothing
a request or socket needs is kept in one process's memory any more where the sandbox runs
Sandpit's agent (local, docker): terminals, streamed runs, watches and the E2B layer's
processes and polled watchers live in the agent, port and process signals are polled by
each process that
has a socket listening, status events go through the channel layer, rate limits and
billing counters through the cache. So with Redis (channel layer and cache shared) any
number of processes is safe, and the default (``auto``) is one per core.

What still keeps one process: the embedded mode (no REDIS_URL), whose channel layer and
cache live in each process's memory (sandbox status events would reach only the sockets
of the process that sent them, and each process would count rate limits and the free
allowance on its own); SQLite itself would cope (file locks, IMMEDIATE transactions, a
20 s busy timeout), but there is no server to share the rest through, so ``auto`` is 1
there and more is refused. And cloud providers' terminals, which stay in the process that
opened them (sandboxes/terminal_registry.py): with one enabled, ``auto`` stays at 1 and
an explicit count is served with a warning.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

from django.conf import settings

from sandboxes.providers import CLOUD_CREDENTIALS, configured_provider_names

_BINDING_OPTIONS = ("-b", "--bind", "-p", "--port", "--processes")


def listening_socket(host: str, port: int, backlog: int = 1024) -> socket.socket:
    """A listening TCP socket on (host, port) that more sockets may share (SO_REUSEPORT)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


def without_binding(args: Sequence[str]) -> list[str]:
    """daphne's arguments minus the TCP binding and --processes (each process gets its
    socket instead)."""
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in _BINDING_OPTIONS:
            skip = True
        elif arg.startswith(("--bind=", "--port=", "--processes=")) or (
            arg[:2] in ("-b", "-p") and len(arg) > 2 and not arg.startswith("--")
        ):
            continue
        else:
            kept.append(arg)
    return kept


def cores() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0))


def unshared_state() -> str | None:
    """Why several processes would split the service (None: nothing would)."""
    backend = str(settings.CHANNEL_LAYERS.get("default", {}).get("BACKEND", ""))
    if backend.endswith("InMemoryChannelLayer"):
        return (
            "without REDIS_URL the channel layer and the cache live in each process's "
            "memory, so sandbox status events would only reach the sockets of the process "
            "that sent them, and each process would count rate limits and the free "
            "allowance on its own"
        )
    return None


def pinned_terminals() -> list[str]:
    """Enabled providers whose terminals stay in the web process that opened them."""
    return [name for name in configured_provider_names() if name in CLOUD_CREDENTIALS]


def check_shareable_state() -> None:
    """Refuse several processes where per-process state would split the service."""
    reason = unshared_state()
    if reason is not None:
        raise SystemExit(f"SANDPIT_WEB_PROCESSES > 1 needs REDIS_URL: {reason}.")


def planned_processes(requested: str | int | None) -> tuple[int, str | None]:
    """How many web processes to run for `requested` ('auto' or None: one per core where
    that is safe, else 1; 0: one per core; N), and a note for the log when the count or
    its consequences need saying. SystemExit for more than 1 where it is unsafe."""
    text = str(requested).strip().lower() if requested is not None else "auto"
    if text in ("", "auto"):
        reason = unshared_state()
        pinned = pinned_terminals()
        if reason is not None:
            return 1, f"one web process ({reason}; with REDIS_URL it serves one per core)"
        if pinned:
            return 1, (
                f"one web process: {', '.join(pinned)} terminals stay in the process that "
                "opened them (SANDPIT_WEB_PROCESSES=N serves more all the same)"
            )
        return cores(), None
    try:
        count = int(text)
    except ValueError:
        raise SystemExit(
            f"SANDPIT_WEB_PROCESSES is 'auto' or a number, not {requested!r}"
        ) from None
    count = cores() if count == 0 else count
    if count <= 1:
        return max(count, 1), None
    check_shareable_state()
    pinned = pinned_terminals()
    if pinned:
        return count, (
            f"warning: {', '.join(pinned)} terminals stay in the process that opened them; "
            "a socket that reaches another process gets close code 4404"
        )
    return count, None


PR_SET_PDEATHSIG = 1


def _die_with_supervisor(supervisor: int) -> None:
    """In a child before exec: SIGTERM when the supervisor dies, however it dies (a
    SIGKILLed supervisor must not leave servers holding the port with nobody to restart
    them)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != supervisor:  # it died before the line above
        os._exit(1)


def serve(processes: int, host: str, port: int, args: Sequence[str]) -> int:
    """Run `processes` web servers on host:port; returns the first one's exit status."""
    check_shareable_state()
    if ":" in host:
        # Twisted's fd: endpoint takes its address family as text and adopts only AF_INET.
        raise SystemExit("SANDPIT_WEB_PROCESSES > 1 serves IPv4 addresses only (-b)")
    sockets = [listening_socket(host, port) for _ in range(processes)]
    rest = without_binding(args)
    # Inherited by every child: how many servers share the machine (it sizes each DB pool).
    os.environ["SANDPIT_WEB_PROCESS_COUNT"] = str(processes)
    children: list[subprocess.Popen[bytes]] = []
    try:
        for sock in sockets:
            argv = [
                sys.executable,
                "-m",
                "playground.webserver",
                "--processes",
                "1",
                "--fd",
                str(sock.fileno()),
                *rest,
            ]
            children.append(
                subprocess.Popen(
                    argv,
                    pass_fds=(sock.fileno(),),
                    preexec_fn=functools.partial(_die_with_supervisor, os.getpid()),  # noqa: PLW1509 - no threads here yet
                )
            )
    finally:
        for sock in sockets:  # each child holds its own copy now
            sock.close()

    def forward(signum: int, _frame: object) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    try:
        while True:
            exited = [child.returncode for child in children if child.poll() is not None]
            if exited:
                code = exited[0]
                break
            time.sleep(0.2)
    finally:
        for child in children:
            if child.poll() is None:
                child.terminate()
        for child in children:
            try:
                child.wait(20)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    return code
