"""File operations on a sandbox, one service each (counted once; see services.py)."""

from __future__ import annotations

from typing import Any

from .activity import sandbox_touch
from .caller import Caller, metered
from .models import Sandbox
from .provider_access import provider_call, provider_for, require_capability, require_running
from .providers.base import Capability, FileEntry, SandboxProvider


def _files(sandbox: Sandbox) -> SandboxProvider:
    require_running(sandbox)
    provider = provider_for(sandbox)
    require_capability(provider, Capability.FILES)
    return provider


def _file_op(caller: Caller, operation: str) -> Any:
    return metered(caller, feature="files", operation=operation, scope="files")


def sandbox_file_list(
    *, caller: Caller, sandbox: Sandbox, path: str, recursive: bool = False
) -> list[FileEntry]:
    """Entries under `path` (counted once)."""
    with _file_op(caller, "files.list"):
        provider = _files(sandbox)
        entries = provider_call(sandbox, provider.list_files, sandbox.provider_id, path, recursive)
    sandbox_touch(sandbox)
    return entries


def sandbox_file_read(
    *, caller: Caller, sandbox: Sandbox, path: str, offset: int = 0, length: int | None = None
) -> bytes:
    """`length` bytes (all when None) of a file from byte `offset` (counted once)."""
    with _file_op(caller, "files.read"):
        provider = _files(sandbox)
        data = provider_call(sandbox, provider.read_file, sandbox.provider_id, path, offset, length)
    sandbox_touch(sandbox)
    return data


def sandbox_file_write(*, caller: Caller, sandbox: Sandbox, path: str, data: bytes) -> FileEntry:
    """Create or replace a file (counted once)."""
    with _file_op(caller, "files.write"):
        provider = _files(sandbox)
        entry = provider_call(sandbox, provider.write_file, sandbox.provider_id, path, data)
    sandbox_touch(sandbox)
    return entry


def sandbox_file_stat(*, caller: Caller, sandbox: Sandbox, path: str) -> FileEntry:
    """One entry's metadata (counted once)."""
    with _file_op(caller, "files.stat"):
        provider = _files(sandbox)
        entry = provider_call(sandbox, provider.stat, sandbox.provider_id, path)
    sandbox_touch(sandbox)
    return entry


def sandbox_file_exists(*, caller: Caller, sandbox: Sandbox, path: str) -> bool:
    """Whether anything (a file, a directory, a symlink, even a dangling one) is at `path`;
    counted once, like a stat. A path that would leave the sandbox is PathNotAllowed, not
    False: the answer must not probe outside."""
    with _file_op(caller, "files.exists"):
        provider = _files(sandbox)
        found = provider_call(sandbox, provider.exists, sandbox.provider_id, path)
    sandbox_touch(sandbox)
    return bool(found)


def sandbox_mkdir(*, caller: Caller, sandbox: Sandbox, path: str) -> FileEntry:
    """Create a directory and its parents (counted once)."""
    with _file_op(caller, "files.mkdir"):
        provider = _files(sandbox)
        entry = provider_call(sandbox, provider.mkdir, sandbox.provider_id, path)
    sandbox_touch(sandbox)
    return entry


def sandbox_file_move(*, caller: Caller, sandbox: Sandbox, src: str, dst: str) -> FileEntry:
    """Rename `src` to `dst` (counted once)."""
    with _file_op(caller, "files.move"):
        provider = _files(sandbox)
        entry = provider_call(sandbox, provider.move, sandbox.provider_id, src, dst)
    sandbox_touch(sandbox)
    return entry


def sandbox_file_remove(
    *, caller: Caller, sandbox: Sandbox, path: str, recursive: bool = False
) -> None:
    """Remove a file, or a directory with `recursive` (counted once)."""
    with _file_op(caller, "files.remove"):
        provider = _files(sandbox)
        provider_call(sandbox, provider.remove, sandbox.provider_id, path, recursive)
    sandbox_touch(sandbox)
