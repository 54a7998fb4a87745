"""Host-side file operations on a sandbox workspace, safe against the sandbox's own tricks.

The workspace is a host directory the sandboxed code controls completely, so
every path is walked one component at a time with ``O_NOFOLLOW`` directory
file descriptors (openat style). Symlinks are resolved by hand against the
workspace as the jail sees it (``/workspace``): a link that leads outside, an
absolute link to anything but ``/workspace``, ``..`` above the root, NUL bytes
or over-long paths raise PathNotAllowed. The final operation always uses the
parent's descriptor and ``O_NOFOLLOW``, so a link swapped in between is refused
rather than followed.

When the server runs as root, what it creates here is handed to the owner of the
workspace root (the jail's host uid), so the sandbox can change and remove it.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat as stat_mod
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sandboxes.providers.base import (
    FileConflict,
    FileEntry,
    FileNotFound,
    FileTooLarge,
    InvalidRequest,
    PathNotAllowed,
    ResourceExhausted,
    SandboxGone,
)

JAIL_WORKSPACE = "/workspace"
MAX_PATH_BYTES = 4096
MAX_NAME_BYTES = 255
MAX_SYMLINK_HOPS = 40
MAX_LIST_ENTRIES = 100_000

_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@contextmanager
def os_errors(path: str) -> Iterator[None]:
    """Translate OSError into the provider error tree (one place)."""
    try:
        yield
    except OSError as exc:
        code = exc.errno
        if code == errno.ENOENT:
            raise FileNotFound(f"no such file or directory: {path}") from None
        if code in (errno.ENAMETOOLONG, errno.EXDEV):
            raise PathNotAllowed(f"path not allowed: {path}") from None
        if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise ResourceExhausted(f"no space left for {path}") from None
        if code == errno.ELOOP:
            # Only O_NOFOLLOW meets a kernel ELOOP here (links are resolved by hand):
            # the sandbox swapped a symbolic link in while we worked.
            raise FileConflict(f"path changed while in use: {path}") from None
        # The sandbox controls the tree and can race every step; whatever else fails is
        # a conflict with its doing, told in the sandbox's terms (never a host path).
        reason = os.strerror(code) if code else "file operation failed"
        raise FileConflict(f"{reason}: {path}") from None


def split_path(path: str) -> list[str]:
    """Workspace-relative components of `path` (relative, or absolute under /workspace)."""
    if not isinstance(path, str) or "\x00" in path:
        raise PathNotAllowed("path contains a NUL byte")
    if len(path.encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES:
        raise PathNotAllowed("path is longer than 4096 bytes")
    if any(
        len(part.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES for part in path.split("/")
    ):
        raise PathNotAllowed(f"a path component is longer than {MAX_NAME_BYTES} bytes")
    if path.startswith("/"):
        if path != JAIL_WORKSPACE and not path.startswith(JAIL_WORKSPACE + "/"):
            raise PathNotAllowed(f"path is outside the workspace: {path}")
        path = path[len(JAIL_WORKSPACE) :]
    return _normalize([], path.split("/"), path)


def _normalize(base: list[str], parts: list[str], shown: str) -> list[str]:
    out = list(base)
    for part in parts:
        if part in ("", "."):
            continue
        if part == "..":
            if not out:
                raise PathNotAllowed(f"path escapes the workspace: {shown}")
            out.pop()
        else:
            out.append(part)
    return out


class Workspace:
    """Safe file operations on one sandbox's workspace directory."""

    def __init__(self, root: Path, max_file_bytes: int, *, chown_to_owner: bool = False) -> None:
        self.root = root
        self.max_file_bytes = max_file_bytes
        self.chown_to_owner = chown_to_owner
        self._owner: tuple[int, int] | None = None

    # -- resolution -------------------------------------------------------

    def _open_root(self) -> int:
        try:
            fd = os.open(self.root, _DIR_FLAGS)
        except FileNotFoundError:
            raise SandboxGone("the sandbox no longer exists") from None
        if self.chown_to_owner and self._owner is None:
            st = os.fstat(fd)
            self._owner = (st.st_uid, st.st_gid)
        return fd

    def _give(self, name: str, dir_fd: int) -> None:
        """Hand a file or directory we just created to the workspace's owner."""
        if self._owner is not None:
            os.chown(name, *self._owner, dir_fd=dir_fd, follow_symlinks=False)

    def resolve(
        self, path: str, *, follow_last: bool, create_dirs: bool = False
    ) -> tuple[int, str | None, list[str]]:
        """Walk `path` safely. Returns (parent dir fd, final name or None for the root,
        resolved workspace-relative parts). The caller closes the fd."""
        pending = split_path(path)
        done: list[str] = []
        dfd = self._open_root()
        hops = 0
        try:
            while pending:
                name = pending[0]
                last = len(pending) == 1
                if last and not follow_last:
                    return dfd, name, [*done, name]
                try:
                    with os_errors(path):
                        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                except FileNotFound:
                    if last:
                        return dfd, name, [*done, name]
                    if not create_dirs:
                        raise FileNotFound(f"no such file or directory: {path}") from None
                    with os_errors(path):
                        os.mkdir(name, 0o755, dir_fd=dfd)
                        self._give(name, dfd)
                    continue
                if stat_mod.S_ISLNK(st.st_mode):
                    hops += 1
                    if hops > MAX_SYMLINK_HOPS:
                        raise PathNotAllowed(f"too many symbolic links: {path}")
                    with os_errors(path):
                        target = os.readlink(name, dir_fd=dfd)
                    if target.startswith("/"):
                        base_parts = split_path(target)
                    else:
                        base_parts = _normalize(done, target.split("/"), path)
                    pending = base_parts + pending[1:]
                    done = []
                    os.close(dfd)
                    dfd = self._open_root()
                    continue
                if last:
                    return dfd, name, [*done, name]
                if not stat_mod.S_ISDIR(st.st_mode):
                    raise FileConflict(f"not a directory: {'/'.join([*done, name])}")
                try:
                    nfd = os.open(name, _DIR_FLAGS, dir_fd=dfd)
                except FileNotFoundError:  # removed meanwhile
                    raise FileNotFound(f"no such file or directory: {path}") from None
                except OSError:  # swapped for a link or a file meanwhile
                    raise FileConflict(f"path changed while in use: {path}") from None
                os.close(dfd)
                dfd = nfd
                done.append(name)
                pending = pending[1:]
            return dfd, None, done
        except BaseException:
            os.close(dfd)
            raise

    def open_dir(self, path: str) -> tuple[int, list[str]]:
        """An O_RDONLY fd on the directory at `path` (links followed safely)."""
        dfd, name, parts = self.resolve(path, follow_last=True)
        try:
            with os_errors(path):
                if name is None:
                    return os.open(
                        ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dfd
                    ), parts
                fd = os.open(
                    name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd
                )
                return fd, parts
        finally:
            os.close(dfd)

    # -- operations -------------------------------------------------------

    def read(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        if offset < 0 or (length is not None and length < 0):
            raise InvalidRequest("offset and length must not be negative")
        dfd, name, _ = self.resolve(path, follow_last=True)
        try:
            if name is None:
                raise FileConflict("is a directory: /workspace")
            with os_errors(path):
                fd = os.open(
                    name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd
                )
        finally:
            os.close(dfd)
        try:
            st = os.fstat(fd)
            if stat_mod.S_ISDIR(st.st_mode):
                raise FileConflict(f"is a directory: {path}")
            if not stat_mod.S_ISREG(st.st_mode):
                raise FileConflict(f"not a regular file: {path}")
            want = max(0, st.st_size - offset) if length is None else length
            if want > self.max_file_bytes:
                raise FileTooLarge(f"{path} is larger than {self.max_file_bytes} bytes")
            chunks = []
            pos = offset
            while want > 0:
                data = os.pread(fd, min(want, 1 << 20), pos)
                if not data:
                    break
                chunks.append(data)
                pos += len(data)
                want -= len(data)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def write(self, path: str, data: bytes) -> FileEntry:
        if len(data) > self.max_file_bytes:
            raise FileTooLarge(f"data is larger than {self.max_file_bytes} bytes")
        dfd, name, parts = self.resolve(path, follow_last=True, create_dirs=True)
        try:
            if name is None:
                raise FileConflict("is a directory: /workspace")
            with os_errors(path):
                fd = os.open(
                    name,
                    os.O_WRONLY
                    | os.O_CREAT
                    | os.O_TRUNC
                    | os.O_NOFOLLOW
                    | os.O_NONBLOCK
                    | os.O_CLOEXEC,
                    0o644,
                    dir_fd=dfd,
                )
                try:
                    st = os.fstat(fd)
                    if not stat_mod.S_ISREG(st.st_mode):
                        raise FileConflict(f"not a regular file: {path}")
                    if self._owner is not None and (st.st_uid, st.st_gid) != self._owner:
                        os.fchown(fd, *self._owner)
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                finally:
                    os.close(fd)
                return _entry(parts, os.stat(name, dir_fd=dfd, follow_symlinks=False))
        finally:
            os.close(dfd)

    def mkdir(self, path: str) -> FileEntry:
        dfd, name, parts = self.resolve(path, follow_last=True, create_dirs=True)
        try:
            with os_errors(path):
                if name is not None:
                    try:
                        os.mkdir(name, 0o755, dir_fd=dfd)
                        self._give(name, dfd)
                    except FileExistsError:
                        pass
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                else:
                    st = os.fstat(dfd)
            if not stat_mod.S_ISDIR(st.st_mode):
                raise FileConflict(f"exists and is not a directory: {path}")
            return _entry(parts, st)
        finally:
            os.close(dfd)

    def stat(self, path: str) -> FileEntry:
        dfd, name, parts = self.resolve(path, follow_last=False)
        try:
            with os_errors(path):
                st = (
                    os.fstat(dfd)
                    if name is None
                    else os.stat(name, dir_fd=dfd, follow_symlinks=False)
                )
            return _entry(parts, st)
        finally:
            os.close(dfd)

    def exists(self, path: str) -> bool:
        try:
            self.stat(path)
        except FileNotFound:
            return False
        return True

    def list(self, path: str, recursive: bool = False) -> list[FileEntry]:
        fd, parts = self.open_dir(path)
        out: list[FileEntry] = []
        try:
            with os_errors(path):
                self._list_into(fd, parts, recursive, out)
        finally:
            os.close(fd)
        out.sort(key=lambda e: e.path)
        return out

    def _list_into(self, fd: int, parts: list[str], recursive: bool, out: list[FileEntry]) -> None:
        subdirs = []
        with os.scandir(fd) as it:
            for entry in it:
                if len(out) >= MAX_LIST_ENTRIES:
                    return
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                out.append(_entry([*parts, entry.name], st))
                if recursive and stat_mod.S_ISDIR(st.st_mode):
                    subdirs.append(entry.name)
        for name in subdirs:
            try:
                sub = os.open(
                    name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
                )
            except OSError:
                continue
            try:
                self._list_into(sub, [*parts, name], recursive, out)
            finally:
                os.close(sub)

    def remove(self, path: str, recursive: bool = False) -> None:
        dfd, name, _ = self.resolve(path, follow_last=False)
        try:
            if name is None:
                raise PathNotAllowed("cannot remove the workspace itself")
            with os_errors(path):
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                if stat_mod.S_ISDIR(st.st_mode):
                    if recursive:
                        shutil.rmtree(name, dir_fd=dfd)
                    else:
                        os.rmdir(name, dir_fd=dfd)
                else:
                    os.unlink(name, dir_fd=dfd)
        finally:
            os.close(dfd)

    def move(self, src: str, dst: str) -> FileEntry:
        sfd, sname, _ = self.resolve(src, follow_last=False)
        try:
            if sname is None:
                raise PathNotAllowed("cannot move the workspace itself")
            dfd, dname, dparts = self.resolve(dst, follow_last=False, create_dirs=True)
            try:
                if dname is None:
                    raise FileConflict("destination exists: /workspace")
                with os_errors(src):
                    os.stat(sname, dir_fd=sfd, follow_symlinks=False)
                with os_errors(dst):
                    try:
                        os.stat(dname, dir_fd=dfd, follow_symlinks=False)
                    except FileNotFoundError:
                        pass
                    else:
                        raise FileConflict(f"destination exists: {dst}")
                    os.rename(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)
                    return _entry(dparts, os.stat(dname, dir_fd=dfd, follow_symlinks=False))
            finally:
                os.close(dfd)
        finally:
            os.close(sfd)


def _entry(parts: list[str], st: os.stat_result) -> FileEntry:
    if stat_mod.S_ISDIR(st.st_mode):
        kind = "dir"
    elif stat_mod.S_ISLNK(st.st_mode):
        kind = "symlink"
    else:
        kind = "file"
    return FileEntry(
        name=parts[-1] if parts else "",
        path="/".join(parts),
        type=kind,
        size=st.st_size,
        mtime=st.st_mtime,
    )
