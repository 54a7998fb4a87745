"""What LocalProvider does inside a running jail: the operations that go to the jail's
agent (sandboxes/agent/, over a Unix socket; agent_operations.py), and the file operations and
watches that run host-side on the workspace (files.py, watch.py).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from sandboxes.providers.agent_operations import AgentOperations
from sandboxes.providers.base import (
    FileEntry,
    FileEvent,
    InvalidRequest,
    ProviderError,
    SandboxGone,
)
from sandboxes.providers.local import jail, jail_cgroups
from sandboxes.providers.local.files import JAIL_WORKSPACE, Workspace
from sandboxes.providers.local.watch import WorkspaceWatch
from sandboxes.providers.unix_sockets import reachable_path


class JailOperations(AgentOperations):
    """Operations on a running jail, for LocalProvider (which supplies the lookups)."""

    root_dir: Path
    lists_every_process = False

    def _dir(self, provider_id: str) -> Path:
        raise NotImplementedError  # LocalProvider's

    def _state(self, provider_id: str) -> tuple[Path, jail.JailState]:
        raise NotImplementedError  # LocalProvider's

    def _workspace(self, provider_id: str) -> Workspace:
        raise NotImplementedError  # LocalProvider's

    # ------------------------------------------------------------------ files

    def read_file(
        self, provider_id: str, path: str, offset: int = 0, length: int | None = None
    ) -> bytes:
        return self._workspace(provider_id).read(path, offset, length)

    def write_file(self, provider_id: str, path: str, data: bytes) -> FileEntry:
        """Creates parent directories; raises FileTooLarge beyond max_file_bytes."""
        return self._workspace(provider_id).write(path, data)

    def mkdir(self, provider_id: str, path: str) -> FileEntry:
        return self._workspace(provider_id).mkdir(path)

    def list_files(self, provider_id: str, path: str, recursive: bool = False) -> list[FileEntry]:
        return self._workspace(provider_id).list_entries(path, recursive)

    def stat(self, provider_id: str, path: str) -> FileEntry:
        return self._workspace(provider_id).stat(path)

    def exists(self, provider_id: str, path: str) -> bool:
        return self._workspace(provider_id).exists(path)

    def remove(self, provider_id: str, path: str, recursive: bool = False) -> None:
        self._workspace(provider_id).remove(path, recursive)

    def move(self, provider_id: str, src: str, dst: str) -> FileEntry:
        return self._workspace(provider_id).move(src, dst)

    # --------------------------------------------------------------- realtime

    def watch(
        self, provider_id: str, path: str, recursive: bool = True
    ) -> Iterator[list[FileEvent]]:
        """Host-side inotify; watches are in place when this returns. Close with .close()."""
        return WorkspaceWatch(self._workspace(provider_id), path, recursive)

    # ------------------------------------------------------------ the agent

    def _agent_cwd(self, cwd: str | None) -> str:
        if not cwd:
            return JAIL_WORKSPACE
        if "\x00" in cwd:
            raise InvalidRequest("cwd contains a NUL byte")
        return cwd if cwd.startswith("/") else f"{JAIL_WORKSPACE}/{cwd}"

    def _oom_mark(self, provider_id: str) -> int | None:
        return _oom_kills(self._state(provider_id)[1])

    def _oom_killed(
        self, provider_id: str, exit_code: int, reply: Mapping[str, Any], mark: int | None
    ) -> bool:
        """The jail's memory cgroup counted a kill during a command that died of SIGKILL
        before its own timeout."""
        if exit_code != -9 or reply["timed_out"] or mark is None:
            return False
        return _oom_kills(self._state(provider_id)[1]) > mark

    def _connect(self, provider_id: str, timeout: float) -> socket.socket:
        run_dir = self._dir(provider_id) / "run"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            with reachable_path(run_dir / "agent.sock") as target:
                _connect_patiently(sock, target, timeout)
        except OSError:
            sock.close()
            if not (self.root_dir / provider_id).exists():
                raise SandboxGone(f"no sandbox {provider_id!r}") from None
            raise SandboxGone(f"sandbox {provider_id} is stopped") from None
        return sock

    def _lost(self, provider_id: str, exc: Exception) -> ProviderError:
        if not (self.root_dir / provider_id).exists():
            return SandboxGone(f"no sandbox {provider_id!r}")
        try:
            _, state = self._state(provider_id)
        except SandboxGone as gone:
            return gone
        if not jail.jail_alive(state):
            return SandboxGone(f"sandbox {provider_id} stopped")
        return ProviderError(f"lost the sandbox agent: {exc!r}")


def _connect_patiently(sock: socket.socket, target: str, timeout: float) -> None:
    """connect(), waiting while the agent's listen backlog is full: a Unix socket answers
    that with EAGAIN at once (the agent is busy, e.g. out of descriptors), not by blocking."""
    deadline = time.monotonic() + timeout
    pause = 0.001
    while True:
        try:
            sock.connect(target)
            return
        except BlockingIOError:
            if time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 0.05)


def _oom_kills(state: jail.JailState) -> int:
    return jail_cgroups.cgroup_oom_kills(state.cgroups)
