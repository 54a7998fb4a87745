"""``--watch PATH RECURSIVE``: the agent's own file watcher, run as a session's command.

inotify through libc (ctypes): the host's local jails have no inotifywait, and a watch
that is a session of the agent (sandboxes/agent/sessions.py) outlives the web process
that asked for it, with its records buffered for a reattach. It writes what
``inotifywait -m --format '%e %w%f%0'`` writes (``"CREATE,ISDIR /workspace/d\\0"``), so
the host parses both the same way, and one empty record once its watches are in place.
New directories are watched as they appear (recursive), and what was created in one
before its watch was in place is reported as created (``mkdir -p d && echo > d/f`` can
finish before the watcher sees ``d``).
"""

from __future__ import annotations

import os
import struct
import sys

IN_MODIFY = 0x2
IN_CLOSE_WRITE = 0x8
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_IGNORED = 0x8000
IN_ISDIR = 0x40000000
IN_Q_OVERFLOW = 0x4000
IN_ONLYDIR = 0x01000000
IN_CLOEXEC = 0o2000000
MASK = IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
NAMES = (
    (IN_MODIFY, "MODIFY"),
    (IN_CLOSE_WRITE, "CLOSE_WRITE"),
    (IN_MOVED_FROM, "MOVED_FROM"),
    (IN_MOVED_TO, "MOVED_TO"),
    (IN_CREATE, "CREATE"),
    (IN_DELETE, "DELETE"),
    (IN_ISDIR, "ISDIR"),
)
HEADER = struct.Struct("iIII")


class Watcher:
    def __init__(self, recursive: bool) -> None:
        import ctypes

        self.libc = ctypes.CDLL(None, use_errno=True)
        self.ctypes = ctypes
        self.fd = self.libc.inotify_init1(IN_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.recursive = recursive
        self.paths: dict[int, str] = {}

    def add(self, path: str, found: list[bytes] | None = None) -> None:
        """Watch `path` (and, recursive, the directories under it). With `found` (a
        directory that appeared while we ran), record what is already in it as created;
        an entry made between the watch and the scan may then be reported twice, never
        missed."""
        wd = self.libc.inotify_add_watch(self.fd, os.fsencode(path), MASK | IN_ONLYDIR)
        if wd >= 0:
            self.paths[wd] = path
        if not self.recursive:
            return
        try:
            entries = list(os.scandir(path))
        except OSError:
            return
        for entry in entries:
            is_dir = entry.is_dir(follow_symlinks=False)
            if found is not None:
                kinds = "CREATE,ISDIR" if is_dir else "CREATE"
                found.append(record(kinds, entry.path))
            if is_dir:
                self.add(entry.path, found)

    def run(self) -> None:
        os.write(1, b"\0")  # watches established
        while True:
            out = self.read_batch()
            if out:
                os.write(1, b"".join(out))

    def read_batch(self) -> list[bytes]:
        """The records of one read of the inotify descriptor (blocks until there is one)."""
        data = os.read(self.fd, 65536)
        out: list[bytes] = []
        pos = 0
        while pos + HEADER.size <= len(data):
            wd, mask, _cookie, size = HEADER.unpack_from(data, pos)
            name = data[pos + HEADER.size : pos + HEADER.size + size].rstrip(b"\0")
            pos += HEADER.size + size
            if mask & (IN_IGNORED | IN_Q_OVERFLOW):
                self.paths.pop(wd, None)
                continue
            base = self.paths.get(wd)
            if base is None:
                continue
            full = os.path.join(base, os.fsdecode(name)) if name else base
            kinds = ",".join(label for bit, label in NAMES if mask & bit)
            if kinds:
                out.append(record(kinds, full))
            if self.recursive and mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO):
                self.add(full, out)
        return out


def record(kinds: str, path: str) -> bytes:
    return f"{kinds} {path}".encode("utf-8", "surrogateescape") + b"\0"


def main(path: str, recursive: str) -> None:
    watcher = Watcher(recursive == "1")
    watcher.add(path)
    try:
        watcher.run()
    except (BrokenPipeError, KeyboardInterrupt):
        sys.exit(0)
