"""The sandbox operations of the `docker` provider over several engines: each goes to the
engine its provider_id names (engines.py builds the ids and does the routing)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from sandboxes.providers.agent_client import AgentExecStream, AgentPortStream
from sandboxes.providers.base import (
    ExecRequest,
    ExecResult,
    FileEntry,
    FileEvent,
    OpenPort,
    ProcessInfo,
    PtySession,
)


class RoutedOperations:
    """Every provider_id-first operation of DockerProvider, sent to the sandbox's engine."""

    def _routed(self, provider_id: str, method: str, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def exec(self, provider_id: str, request: ExecRequest) -> ExecResult:
        result: ExecResult = self._routed(provider_id, "exec", request)
        return result

    def exec_stream(self, provider_id: str, request: ExecRequest) -> AgentExecStream:
        stream: AgentExecStream = self._routed(provider_id, "exec_stream", request)
        return stream

    def read_file(
        self, provider_id: str, path: str, offset: int = 0, length: int | None = None
    ) -> bytes:
        data: bytes = self._routed(provider_id, "read_file", path, offset, length)
        return data

    def write_file(self, provider_id: str, path: str, data: bytes) -> FileEntry:
        entry: FileEntry = self._routed(provider_id, "write_file", path, data)
        return entry

    def mkdir(self, provider_id: str, path: str) -> FileEntry:
        entry: FileEntry = self._routed(provider_id, "mkdir", path)
        return entry

    def list_files(self, provider_id: str, path: str, recursive: bool = False) -> list[FileEntry]:
        entries: list[FileEntry] = self._routed(provider_id, "list_files", path, recursive)
        return entries

    def stat(self, provider_id: str, path: str) -> FileEntry:
        entry: FileEntry = self._routed(provider_id, "stat", path)
        return entry

    def exists(self, provider_id: str, path: str) -> bool:
        return bool(self._routed(provider_id, "exists", path))

    def remove(self, provider_id: str, path: str, recursive: bool = False) -> None:
        self._routed(provider_id, "remove", path, recursive)

    def move(self, provider_id: str, src: str, dst: str) -> FileEntry:
        entry: FileEntry = self._routed(provider_id, "move", src, dst)
        return entry

    def start_process(
        self,
        provider_id: str,
        command: str,
        args: Sequence[str] | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ProcessInfo:
        info: ProcessInfo = self._routed(provider_id, "start_process", command, args, cwd, env)
        return info

    def list_processes(self, provider_id: str) -> list[ProcessInfo]:
        processes: list[ProcessInfo] = self._routed(provider_id, "list_processes")
        return processes

    def signal_process(self, provider_id: str, pid: int, signal: int) -> None:
        self._routed(provider_id, "signal_process", pid, signal)

    def open_pty(
        self,
        provider_id: str,
        cols: int = 80,
        rows: int = 24,
        shell: str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> PtySession:
        session: PtySession = self._routed(provider_id, "open_pty", cols, rows, shell, cwd, env)
        return session

    def open_ports(self, provider_id: str) -> list[OpenPort]:
        ports: list[OpenPort] = self._routed(provider_id, "open_ports")
        return ports

    def connect_port(self, provider_id: str, port: int) -> AgentPortStream:
        stream: AgentPortStream = self._routed(provider_id, "connect_port", port)
        return stream

    def watch(
        self, provider_id: str, path: str, recursive: bool = True
    ) -> Iterator[list[FileEvent]]:
        watch: Iterator[list[FileEvent]] = self._routed(provider_id, "watch", path, recursive)
        return watch
