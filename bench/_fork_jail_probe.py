"""Run by bench_jail_start.py with the jails' interpreter (``python3 -I -S``): import the
agent from its bundle as a started jail holds it, then make jails by forking this process
instead of starting an interpreter, `count` times, one after another.

Each: fork; the child unshares the namespaces bwrap's ``--unshare-all`` makes (mount, UTS,
IPC, PID, network; not the user namespace: it runs as root here), forks the new PID
namespace's first process, which mounts a tmpfs and its own /proc, and exits. Not a jail
(no root of its own, no uid change, no cgroups): the part of a start that forking would
keep, for an estimate of what it would save. Prints one wall time (ms) per jail.

Usage: python3 -I -S _fork_jail_probe.py BUNDLE COUNT MOUNT_POINT
"""

import ctypes
import os
import sys
import time

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18


def make_one(libc: ctypes.CDLL, mount_point: bytes) -> None:
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            flags = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWPID | CLONE_NEWNET
            if libc.unshare(flags) == 0:
                libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None)
                first = os.fork()  # the new PID namespace's first process
                if first == 0:
                    tmpfs = libc.mount(b"sandpit", mount_point, b"tmpfs", 0, b"size=1m")
                    proc = libc.mount(b"proc", b"/proc", b"proc", 0, None)
                    os._exit(0 if tmpfs == 0 and proc == 0 else 3)
                _, status = os.waitpid(first, 0)
                code = os.waitstatus_to_exitcode(status)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"a forked jail failed (status {status})")


def main() -> None:
    bundle, count, mount_point = sys.argv[1], int(sys.argv[2]), os.fsencode(sys.argv[3])
    sys.path.insert(0, bundle)
    # What a started jail has imported before its first request (sandboxes/agent/server.py).
    from sandpit_agent import server  # noqa: F401

    libc = ctypes.CDLL(None, use_errno=True)
    for _ in range(count):
        started = time.perf_counter()
        make_one(libc, mount_point)
        print(f"{(time.perf_counter() - started) * 1000:.3f}", flush=True)


if __name__ == "__main__":
    main()
