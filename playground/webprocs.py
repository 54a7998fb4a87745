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

Each process keeps its own database pool, warm pool of jails and request threads. What
one process holds in memory, the others do not see: the in-memory channel layer of the
embedded mode is one of those, so more than one process needs Redis.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

from django.conf import settings

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


def check_shareable_state() -> None:
    """Refuse several processes where per-process state would split the service."""
    backend = str(settings.CHANNEL_LAYERS.get("default", {}).get("BACKEND", ""))
    if backend.endswith("InMemoryChannelLayer"):
        raise SystemExit(
            "SANDPIT_WEB_PROCESSES > 1 needs REDIS_URL: without it the channel layer lives "
            "in each process's memory, so sandbox events and terminals would only reach "
            "clients of the process that made them."
        )


def serve(processes: int, host: str, port: int, args: Sequence[str]) -> int:
    """Run `processes` web servers on host:port; returns the first one's exit status."""
    check_shareable_state()
    if ":" in host:
        # Twisted's fd: endpoint takes its address family as text and adopts only AF_INET.
        raise SystemExit("SANDPIT_WEB_PROCESSES > 1 serves IPv4 addresses only (-b)")
    sockets = [listening_socket(host, port) for _ in range(processes)]
    rest = without_binding(args)
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
            children.append(subprocess.Popen(argv, pass_fds=(sock.fileno(),)))
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
