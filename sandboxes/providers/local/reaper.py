"""Reaps this process's jail helpers (bwrap, slirp4netns) the moment they exit.

A jail outlives the request that created it and any Sandpit process may
destroy it (state.json holds what that takes), so the creator is often not the
process that kills it. bwrap and slirp4netns are still the creator's children,
though, and would linger as zombies until it waited for them. One daemon
thread per process waits on a pidfd per child and reaps each as it exits.
Neither a SIGCHLD handler (process-wide, it would fight Django, Celery or
asyncio for the signal) nor double-forking (it relies on PID 1 reaping
orphans, which not every container init does) is needed.
"""

from __future__ import annotations

import os
import select
import subprocess
import threading


class ChildReaper:
    """Waits for watched children in a background thread; safe across fork()."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._after_fork)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._wake_r = self._wake_w = -1

    def _after_fork(self) -> None:
        # The parent's children and thread are not ours: drop them (and their fds).
        for fd in [*self._procs, self._wake_r, self._wake_w]:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._reset()

    def watch(self, proc: subprocess.Popen[bytes]) -> None:
        """Reap `proc` as soon as it exits, whoever made it exit."""
        try:
            pidfd = os.pidfd_open(proc.pid)
        except OSError:  # already reaped, or a kernel without pidfds (< 5.3)
            proc.poll()
            return
        with self._lock:
            if self._wake_w < 0:
                self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
                threading.Thread(
                    target=self._run, args=(self._wake_r,), name="sandpit-local-reaper", daemon=True
                ).start()
            self._procs[pidfd] = proc
            try:
                os.write(self._wake_w, b"x")
            except BlockingIOError:  # the thread has wake-ups pending already
                pass

    def _run(self, wake_r: int) -> None:
        poller = select.poll()
        poller.register(wake_r, select.POLLIN)
        polled: set[int] = set()
        while True:
            with self._lock:
                for fd in self._procs.keys() - polled:
                    poller.register(fd, select.POLLIN)
                    polled.add(fd)
            for fd, _ in poller.poll():
                if fd == wake_r:
                    try:
                        os.read(wake_r, 4096)
                    except BlockingIOError:
                        pass
                    continue
                with self._lock:
                    proc = self._procs.pop(fd, None)
                poller.unregister(fd)
                polled.discard(fd)
                os.close(fd)
                if proc is not None:
                    proc.poll()


REAPER = ChildReaper()
