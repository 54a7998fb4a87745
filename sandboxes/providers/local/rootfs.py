"""Read-only root file systems for local jails started from a template.

A template built by Docker is exported (a tar stream of the image's files) and unpacked
here into ``<template root>/<name>/``; a jail then binds that directory read-only at ``/``
instead of the host's /usr and /etc (jail.py), and the local provider still needs no
daemon at run time. What the unpacking guarantees, whatever the Dockerfile did:

* every file is owned by root (0:0) and writable by root only: the image's uid 1000 may
  be a real account on the host, which must not be able to change what jails run;
* no device nodes, FIFOs, setuid/setgid/sticky bits, no member outside the directory
  (tarfile's 'tar' filter plus our own), hard links only inside it;
* the mount points a jail binds over exist (/workspace, /tmp, /run/sandpit, the agent's
  file, /etc/passwd and friends), since a read-only tree cannot get them later.

The directory is written under a temporary name and renamed into place, so a jail never
sees half a tree.
"""

from __future__ import annotations

import os
import shutil
import tarfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, cast

from sandboxes.providers.base import ProviderError

JAIL_MOUNT_DIRS = ("workspace", "tmp", "run/sandpit", "proc", "dev", "opt/sandpit")
JAIL_MOUNT_FILES = (
    "opt/sandpit/agent.pyz",
    "opt/sandpit/exec-shim",
    "etc/passwd",
    "etc/group",
    "etc/hosts",
    "etc/hostname",
    "etc/resolv.conf",
)
REQUIRED = ("usr/bin/python3",)
"""What the in-sandbox agent needs to start (it is stdlib-only Python)."""


class RootfsInvalid(ProviderError):
    """The tree cannot serve as a jail's root; the message says why."""


class _ChunkReader:
    """A read()-able file over an iterator of byte chunks (tarfile's stream mode)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks: Iterator[bytes] = iter(chunks)
        self._buffer = b""

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self._buffer) < size:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            self._buffer += chunk
        if size < 0:
            data, self._buffer = self._buffer, b""
        else:
            data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data


def _member_filter(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    if member.isdev() or member.isfifo():
        return None
    name = member.name.lstrip("/")
    if name in ("", ".") or name.startswith(".dockerenv"):
        return None
    filtered = tarfile.tar_filter(member, dest)  # no escape, no setuid/setgid, no g/o write
    if filtered is None:
        return None
    return filtered.replace(uid=0, gid=0, uname="root", gname="root", deep=False)


def rootfs_install(chunks: Iterable[bytes], target: Path) -> int:
    """Unpack the tar stream `chunks` as the jail root `target` (replacing one already
    there). Returns the tree's size in bytes. Raises RootfsInvalid when the result lacks
    what a jail needs (python3 for the agent), tarfile errors for a malformed stream."""
    target = target.resolve()
    target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    staging = target.with_name(f".{target.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(mode=0o755)
    try:
        with tarfile.open(fileobj=cast(IO[bytes], _ChunkReader(chunks)), mode="r|") as archive:
            for member in archive:
                kept = _member_filter(member, str(staging))
                if kept is not None:
                    archive.extract(kept, staging, set_attrs=True, numeric_owner=True, filter=_same)
        _add_mount_points(staging)
        for needed in REQUIRED:
            if not os.path.lexists(staging / needed):
                raise RootfsInvalid(
                    f"The image has no /{needed}: the sandbox agent needs it (build FROM a "
                    "Sandpit image)."
                )
        if os.geteuid() == 0:
            os.chown(staging, 0, 0)
        os.chmod(staging, 0o755)  # noqa: S103 - jails (other uids) read it; nobody writes
        size = tree_bytes(staging)
        old = target.with_name(f".{target.name}.old")
        if target.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.rename(target, old)
        os.rename(staging, target)
        shutil.rmtree(old, ignore_errors=True)
        return size
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _same(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """Members reach extract() already filtered by _member_filter."""
    return member


def _add_mount_points(root: Path) -> None:
    """Make every mount point a real directory or file inside `root`. The image may hold
    links anywhere (`/opt -> /`, `/etc/resolv.conf -> /run/...`): following one here would
    create or delete files on the host, so each component is checked without following it
    (its parent is already known to be a real directory of the tree) and a link in the way
    is removed (the link itself, inside the tree)."""
    for sub in JAIL_MOUNT_DIRS:
        _real_dir(root, Path(sub))
    for sub in JAIL_MOUNT_FILES:
        parent = _real_dir(root, Path(sub).parent)
        path = parent / Path(sub).name
        if path.is_symlink() or (path.exists() and not path.is_file()):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        if not path.exists():
            path.touch(mode=0o644)
    if os.geteuid() == 0:
        for sub in (*JAIL_MOUNT_DIRS, *JAIL_MOUNT_FILES):
            os.lchown(root / sub, 0, 0)


def _real_dir(root: Path, relative: Path) -> Path:
    current = root
    for part in relative.parts:
        current = current / part
        if current.is_symlink() or (current.exists() and not current.is_dir()):
            current.unlink()
        if not current.exists():
            current.mkdir(mode=0o755)
    return current


def tree_bytes(root: Path) -> int:
    """Apparent size of the files under `root` (links not followed)."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


def rootfs_check(path: str | Path) -> Path:
    """`path` as a usable jail root, or RootfsInvalid: an absolute directory holding
    python3, owned by root when Sandpit runs as root, writable by nobody else."""
    root = Path(path)
    if not root.is_absolute() or not root.is_dir():
        raise RootfsInvalid(f"The template's root file system {path} is missing.")
    info = root.stat()
    if os.geteuid() == 0 and info.st_uid != 0:
        raise RootfsInvalid(f"The template's root file system {path} is not owned by root.")
    if info.st_mode & 0o022:
        raise RootfsInvalid(f"The template's root file system {path} is writable by others.")
    for needed in REQUIRED:
        if not os.path.lexists(root / needed):
            raise RootfsInvalid(f"The template's root file system {path} has no /{needed}.")
    return root


def rootfs_remove(path: str | Path) -> bool:
    """Delete a template's tree; False when it was not there."""
    root = Path(path)
    if not root.exists():
        return False
    shutil.rmtree(root)
    return True
