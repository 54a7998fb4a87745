"""Exec a command the way a script starts a server: SIGINT and SIGQUIT ignored (what a
non-interactive shell does to `cmd &`) and SIGCHLD blocked (what some init scripts and
supervisors leave behind). Both survive exec, so the product must not pass them on.

    python -m tests.unfriendly_launch PROGRAM [ARGS...]
"""

from __future__ import annotations

import os
import signal
import sys


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    os.execvp(sys.argv[1], sys.argv[1:])  # noqa: S606 - the command is the caller's


if __name__ == "__main__":
    main()
