"""Run by bench_jail_start.py with the jails' interpreter (``python3 -I -S``): import the
agent from its bundle as a started jail holds it, then make `count` jails one after
another without starting an interpreter in them, and print one wall time (ms) per jail.

Two ways, neither a whole jail (no uid change, no cgroups, no agent serving):

- ``unshare``: fork; the child unshares the namespaces bwrap's ``--unshare-all`` makes
  (mount, UTS, IPC, PID, network; no user namespace: it runs as root here) and forks the
  new PID namespace's first process, which mounts a tmpfs and its own /proc. A lower bound:
  no root file system of its own (bwrap's binds, pivot_root).
- ``setns``: bwrap makes the jail as for a sandbox (the bench's arguments: its own root,
  /proc, /dev and namespaces) around a placeholder (``sh`` that says it is ready, then
  ``sleep``); this process forks, the child enters the placeholder's namespaces (setns:
  user, IPC, UTS, network, PID, mount) and forks the process that would be the agent, which
  finds itself in the jail's root. bwrap's set-up is kept, only the interpreter's start and
  the agent's import are not paid again.

Usage: python3 -I -S _fork_jail_probe.py BUNDLE COUNT MOUNT_POINT unshare|setns [BWRAP...]
"""

import ctypes
import json
import os
import subprocess
import sys
import time

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
NAMESPACES = ("user", "ipc", "uts", "net", "pid", "mnt")  # the user namespace first


def _exit_code(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def by_unshare(libc: ctypes.CDLL, mount_point: bytes) -> None:
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
                code = _exit_code(first)
        finally:
            os._exit(code)
    if _exit_code(pid) != 0:
        raise SystemExit("a jail made by unshare failed")


def _placeholder(bwrap: list[str]) -> tuple[subprocess.Popen[bytes], int]:
    """bwrap around `sh`, once `sh` runs in the finished jail; and its pid on the host."""
    info_r, info_w = os.pipe()
    ready_r, ready_w = os.pipe()
    proc = subprocess.Popen(
        [*bwrap, "--info-fd", str(info_w), "sh", "-c", f"echo >&{ready_w}; exec sleep 600"],
        pass_fds=(info_w, ready_w),
    )
    os.close(info_w)
    os.close(ready_w)
    info = b""
    while b"}" not in info:  # bwrap writes the JSON in pieces
        info += os.read(info_r, 4096)
    os.close(info_r)
    os.read(ready_r, 1)  # bwrap has finished the root: sh runs in it
    os.close(ready_r)
    return proc, int(json.loads(info)["child-pid"])


def by_setns(libc: ctypes.CDLL, bwrap: list[str]) -> None:
    host_root = os.stat("/")
    proc, target = _placeholder(bwrap)
    try:
        fds = [os.open(f"/proc/{target}/ns/{name}", os.O_RDONLY) for name in NAMESPACES]
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                if all(libc.setns(fd, 0) == 0 for fd in fds):
                    agent = os.fork()  # in the jail's PID namespace
                    if agent == 0:
                        root = os.stat("/")  # the jail's, not the host's
                        moved = (root.st_dev, root.st_ino) != (host_root.st_dev, host_root.st_ino)
                        os._exit(0 if moved and os.path.isdir("/usr/bin") else 5)
                    code = _exit_code(agent)
            finally:
                os._exit(code)
        for fd in fds:
            os.close(fd)
        if _exit_code(pid) != 0:
            raise SystemExit("a process forked into a jail by setns failed")
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    bundle, count, mount_point, how = sys.argv[1:5]
    bwrap = sys.argv[5:]
    sys.path.insert(0, bundle)
    # What a started jail has imported before its first request (sandboxes/agent/server.py).
    from sandpit_agent import server  # noqa: F401

    libc = ctypes.CDLL(None, use_errno=True)
    for _ in range(int(count)):
        started = time.perf_counter()
        if how == "setns":
            by_setns(libc, bwrap)
        else:
            by_unshare(libc, os.fsencode(mount_point))
        print(f"{(time.perf_counter() - started) * 1000:.3f}", flush=True)


if __name__ == "__main__":
    main()
