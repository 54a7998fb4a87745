"""Host-side inotify watch of a sandbox workspace (ctypes on libc, no dependency).

Watches are added through ``/proc/self/fd/N`` of directories opened safely
(O_NOFOLLOW walk), so a symlink planted by the sandbox never makes us watch a
host directory. Watches are a per-uid kernel budget shared with the whole
host, hence MAX_WATCHED_DIRS.
"""

from __future__ import annotations

import ctypes
import os
import select
import struct

from sandboxes.providers.base import FileEvent
from sandboxes.providers.local.files import Workspace

IN_MODIFY = 0x002
IN_CLOSE_WRITE = 0x008
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_IGNORED = 0x8000
IN_ISDIR = 0x40000000
IN_Q_OVERFLOW = 0x4000
IN_ONLYDIR = 0x01000000
IN_EXCL_UNLINK = 0x04000000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000

_MASK = (
    IN_MODIFY
    | IN_CLOSE_WRITE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_ONLYDIR
    | IN_EXCL_UNLINK
)
_HEADER = struct.Struct("iIII")
MAX_WATCHED_DIRS = 4096
IDLE_CHECK_S = 1.0

_libc: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL("libc.so.6", use_errno=True)
    return _libc


class WorkspaceWatch:
    """Iterator of FileEvent batches; ready as soon as it is constructed."""

    def __init__(self, workspace: Workspace, path: str, recursive: bool) -> None:
        self._ws = workspace
        self._recursive = recursive
        self._wds: dict[int, str] = {}
        self._closed = False
        self._busy = False
        libc = _lib()
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        self._fd = fd
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            dir_fd, parts = workspace.open_dir(path)
            try:
                self._root_wd = self._add_tree(dir_fd, "/".join(parts))
            finally:
                os.close(dir_fd)
        except BaseException:
            self._release()
            raise

    def _add(self, dir_fd: int, rel: str) -> int:
        if len(self._wds) >= MAX_WATCHED_DIRS:
            return -1
        wd = _lib().inotify_add_watch(self._fd, f"/proc/self/fd/{dir_fd}".encode(), _MASK)
        if wd >= 0:
            self._wds[wd] = rel
        return wd

    def _add_tree(self, dir_fd: int, rel: str) -> int:
        wd = self._add(dir_fd, rel)
        if not self._recursive:
            return wd
        try:
            names = [e.name for e in os.scandir(dir_fd) if e.is_dir(follow_symlinks=False)]
        except OSError:
            return wd
        for name in names:
            try:
                sub = os.open(
                    name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd
                )
            except OSError:
                continue
            try:
                self._add_tree(sub, _join(rel, name))
            finally:
                os.close(sub)
        return wd

    def _watch_new_dir(self, rel: str) -> list[FileEvent]:
        """Watch a directory that appeared, reporting what was created in it before."""
        if not self._recursive:
            return []
        try:
            dir_fd, _ = self._ws.open_dir(rel)
        except Exception:  # noqa: BLE001 - it may be gone or replaced already
            return []
        try:
            self._add_tree(dir_fd, rel)
            found = []
            for entry in os.scandir(dir_fd):
                found.append(
                    FileEvent(
                        "created", _join(rel, entry.name), entry.is_dir(follow_symlinks=False)
                    )
                )
            return found
        except OSError:
            return []
        finally:
            os.close(dir_fd)

    def __iter__(self) -> WorkspaceWatch:
        return self

    def __next__(self) -> list[FileEvent]:
        self._busy = True
        try:
            while not self._closed:
                ready, _, _ = select.select([self._fd, self._wake_r], [], [], IDLE_CHECK_S)
                if self._closed:
                    break
                if not ready:
                    if not self._ws.root.exists():
                        break
                    continue
                try:
                    data = os.read(self._fd, 1 << 16)
                except BlockingIOError:
                    continue
                batch, ended = self._parse(data)
                if batch:
                    return batch
                if ended:
                    break
            self._closed = True
            raise StopIteration
        finally:
            self._busy = False
            if self._closed:
                self._release()

    def _parse(self, data: bytes) -> tuple[list[FileEvent], bool]:
        events: list[FileEvent] = []
        moves: dict[int, tuple[str, bool]] = {}
        ended = False
        seen_modified: set[str] = set()
        pos = 0
        while pos + _HEADER.size <= len(data):
            wd, mask, cookie, length = _HEADER.unpack_from(data, pos)
            raw = data[pos + _HEADER.size : pos + _HEADER.size + length]
            pos += _HEADER.size + length
            name = raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            if mask & IN_Q_OVERFLOW:
                continue
            base = self._wds.get(wd)
            if mask & IN_IGNORED:
                self._wds.pop(wd, None)
                if wd == self._root_wd:
                    ended = True
                continue
            if base is None or mask & IN_DELETE_SELF:
                continue
            rel = _join(base, name)
            is_dir = bool(mask & IN_ISDIR)
            if mask & IN_CREATE:
                events.append(FileEvent("created", rel, is_dir))
                if is_dir:
                    events.extend(self._watch_new_dir(rel))
            elif mask & IN_DELETE:
                events.append(FileEvent("deleted", rel, is_dir))
            elif mask & (IN_MODIFY | IN_CLOSE_WRITE):
                if rel not in seen_modified:
                    seen_modified.add(rel)
                    events.append(FileEvent("modified", rel, is_dir))
            elif mask & IN_MOVED_FROM:
                moves[cookie] = (rel, is_dir)
            elif mask & IN_MOVED_TO:
                old = moves.pop(cookie, None)
                if old is None:
                    events.append(FileEvent("created", rel, is_dir))
                else:
                    events.append(FileEvent("moved", rel, is_dir, old_path=old[0]))
                if is_dir:
                    self._forget_under(old[0] if old else None)
                    events.extend(self._watch_new_dir(rel))
        for rel, is_dir in moves.values():
            events.append(FileEvent("deleted", rel, is_dir))
        return events, ended

    def _forget_under(self, old: str | None) -> None:
        if old is None:
            return
        for wd, rel in list(self._wds.items()):
            if rel == old or rel.startswith(old + "/"):
                _lib().inotify_rm_watch(self._fd, wd)
                self._wds.pop(wd, None)

    def close(self) -> None:
        """Stop watching; safe from another thread while __next__ blocks."""
        self._closed = True
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        if not self._busy:
            self._release()

    def _release(self) -> None:
        for attr in ("_fd", "_wake_r", "_wake_w"):
            fd = getattr(self, attr, -1)
            if fd >= 0:
                setattr(self, attr, -1)
                try:
                    os.close(fd)
                except OSError:
                    pass

    def __del__(self) -> None:
        self._closed = True
        self._release()


def _join(base: str, name: str) -> str:
    return f"{base}/{name}" if base else name
