"""Host-side file operations on a sandbox's writable directories, safe against the
sandbox's own tricks.

The sandbox user may write in two places, each a host directory bound into the jail:
``/workspace`` (also HOME; relative paths start here) and ``/tmp``. The sandboxed code
controls both completely, so every path is walked one component at a time with
``O_NOFOLLOW`` directory file descriptors (openat style). Paths and symlinks are resolved
by hand as the jail sees them: a link in /workspace to ``/tmp/x`` (or ``../tmp/x``) leads
into the tmp root, never into the host's /tmp; anything that would end outside those two
roots (an absolute link elsewhere, ``..`` above a root into the jail's read-only system
directories), NUL bytes or over-long paths raise PathNotAllowed. The final operation
always uses the parent's descriptor and ``O_NOFOLLOW``, so a link swapped in between is
refused rather than followed.

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
JAIL_ROOTS = ("workspace", "tmp")
"""The jail's writable directories (first component of the absolute path), the first being
where relative paths start."""
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
    """The absolute components of `path` as the jail sees it, `..` resolved lexically
    (relative paths start at /workspace), e.g. ['tmp', 'x']. PathNotAllowed when it would
    end outside /workspace and /tmp."""
    if not isinstance(path, str) or "\x00" in path:
        raise PathNotAllowed("path contains a NUL byte")
    if len(path.encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES:
        raise PathNotAllowed("path is longer than 4096 bytes")
    if any(
        len(part.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES for part in path.split("/")
    ):
        raise PathNotAllowed(f"a path component is longer than {MAX_NAME_BYTES} bytes")
    base = [] if path.startswith("/") else [JAIL_ROOTS[0]]
    return _normalize(base, path.split("/"), path)


def _normalize(base: list[str], parts: list[str], shown: str) -> list[str]:
    out = list(base)
    for part in parts:
        if part in ("", "."):
            continue
        if part == "..":
            if not out:
                raise PathNotAllowed(f"path escapes the sandbox: {shown}")
            out.pop()
        else:
            out.append(part)
    if not out or out[0] not in JAIL_ROOTS:
        raise PathNotAllowed(
            f"path is outside the sandbox's writable directories (/workspace, /tmp): {shown}"
        )
    return out


def shown_parts(parts: list[str]) -> list[str]:
    """How an absolute path is shown in entries: relative under the workspace (as always),
    absolute elsewhere (['', 'tmp', 'x'] joins to '/tmp/x')."""
    if parts[0] == JAIL_ROOTS[0]:
        return parts[1:]
    return ["", *parts]


class Workspace:
    """Safe file operations on one sandbox's writable directories: the workspace and, when
    given, the directory bound at /tmp."""

    def __init__(
        self,
        root: Path,
        max_file_bytes: int,
        *,
        chown_to_owner: bool = False,
        tmp: Path | None = None,
    ) -> None:
        self.root = root
        self.roots = {JAIL_ROOTS[0]: root, **({"tmp": tmp} if tmp is not None else {})}
        self.max_file_bytes = max_file_bytes
        self.chown_to_owner = chown_to_owner
        self._owner: tuple[int, int] | None = None

    # -- resolution -------------------------------------------------------

    def _open_root(self, name: str = JAIL_ROOTS[0]) -> int:
        host = self.roots.get(name)
        if host is None:
            raise PathNotAllowed(f"/{name} is not reachable through the file API here")
        try:
            fd = os.open(host, _DIR_FLAGS)
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
        """Walk `path` safely. Returns (parent dir fd, final name or None for a root,
        resolved parts as entries show them, see `shown_parts`). The caller closes the fd."""
        root, *pending = split_path(path)
        done: list[str] = []
        dfd = self._open_root(root)
        hops = 0
        try:
            while pending:
                name = pending[0]
                last = len(pending) == 1
                if last and not follow_last:
                    return dfd, name, shown_parts([root, *done, name])
                try:
                    with os_errors(path):
                        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                except FileNotFound:
                    if last:
                        return dfd, name, shown_parts([root, *done, name])
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
                    # As the jail resolves it: absolute from its /, relative from the
                    # link's directory, with the rest of the path after it; either may
                    # cross into the other root, and only where it ends must be inside.
                    base = [] if target.startswith("/") else [root, *done]
                    rest = [*target.split("/"), *pending[1:]]
                    root, *pending = _normalize(base, rest, path)
                    done = []
                    os.close(dfd)
                    dfd = -1  # closed: a failure to open the next root must not close it again
                    dfd = self._open_root(root)
                    continue
                if last:
                    return dfd, name, shown_parts([root, *done, name])
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
            return dfd, None, shown_parts([root, *done])
        except BaseException:
            if dfd >= 0:
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
                raise FileConflict(f"is a directory: {path}")
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
                raise FileConflict(f"is a directory: {path}")
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

    def list_entries(self, path: str, recursive: bool = False) -> list[FileEntry]:
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
                raise PathNotAllowed(f"cannot remove {path} itself (a root of the sandbox)")
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
                raise PathNotAllowed(f"cannot move {src} itself (a root of the sandbox)")
            dfd, dname, dparts = self.resolve(dst, follow_last=False, create_dirs=True)
            try:
                if dname is None:
                    raise FileConflict(f"destination exists: {dst}")
                with os_errors(src):
                    os.stat(sname, dir_fd=sfd, follow_symlinks=False)
                with os_errors(dst):
                    try:
                        os.stat(dname, dir_fd=dfd, follow_symlinks=False)
                    except FileNotFoundError:
                        pass
                    else:
                        raise FileConflict(f"destination exists: {dst}")
                    try:
                        os.rename(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)
                    except OSError as exc:
                        if exc.errno != errno.EXDEV:
                            raise
                        # /workspace and /tmp are separate mounts: a file is copied, as
                        # mv does; a directory is refused rather than copied tree-wise.
                        self._copy_file(sfd, sname, dfd, dname, src)
                        os.unlink(sname, dir_fd=sfd)
                    return _entry(dparts, os.stat(dname, dir_fd=dfd, follow_symlinks=False))
            finally:
                os.close(dfd)
        finally:
            os.close(sfd)

    def _copy_file(self, sfd: int, sname: str, dfd: int, dname: str, shown: str) -> None:
        """Copy the regular file `sname` to a new `dname` (both by their directory fds,
        never following a link); FileConflict for anything else."""
        fd = os.open(sname, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=sfd)
        try:
            st = os.fstat(fd)
            if not stat_mod.S_ISREG(st.st_mode):
                raise FileConflict(
                    f"only files move between /workspace and /tmp; {shown} is not one"
                )
            if st.st_size > self.max_file_bytes:
                raise FileTooLarge(f"{shown} is larger than {self.max_file_bytes} bytes")
            out = os.open(
                dname,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                stat_mod.S_IMODE(st.st_mode),
                dir_fd=dfd,
            )
            try:
                if self._owner is not None:
                    os.fchown(out, *self._owner)
                while chunk := os.read(fd, 1 << 20):
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(out, view) :]
            finally:
                os.close(out)
        finally:
            os.close(fd)


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
