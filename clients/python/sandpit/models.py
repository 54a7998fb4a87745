"""What the API returns, as frozen dataclasses with units in their names."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


def _time(value: Any) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


@dataclass(frozen=True)
class SandboxInfo:
    """A sandbox as the server records it."""

    id: str
    state: str
    """'creating', 'running', 'paused', 'archived', 'stopped', 'error' or 'destroyed'."""
    provider: str
    template: str
    timeout_s: int
    """Idle timeout: destroyed after this many seconds without activity."""
    network: bool
    resources: dict[str, Any] = field(default_factory=dict)
    """memory_mb, cpu_count, pids, disk_mb."""
    metadata: dict[str, Any] = field(default_factory=dict)
    created_at: datetime | None = None
    started_at: datetime | None = None
    destroyed_at: datetime | None = None
    last_activity_at: datetime | None = None
    expires_at: datetime | None = None
    """The maximum lifetime's end: destroyed then regardless of activity."""
    error_message: str | None = None
    destroy_reason: str | None = None
    paused_at: datetime | None = None
    """When it was paused (None unless paused or archived)."""
    snapshot: str | None = None
    """The snapshot it was started from (snp_...), if any."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SandboxInfo:
        return cls(
            id=data["id"],
            state=data["state"],
            provider=data.get("provider", ""),
            template=data.get("template", ""),
            timeout_s=int(data.get("timeout_s") or 0),
            network=bool(data.get("network")),
            resources=dict(data.get("resources") or {}),
            metadata=dict(data.get("metadata") or {}),
            created_at=_time(data.get("created_at")),
            started_at=_time(data.get("started_at")),
            destroyed_at=_time(data.get("destroyed_at")),
            last_activity_at=_time(data.get("last_activity_at")),
            expires_at=_time(data.get("expires_at")),
            error_message=data.get("error_message") or None,
            destroy_reason=data.get("destroy_reason") or None,
            paused_at=_time(data.get("paused_at")),
            snapshot=data.get("snapshot") or None,
        )


@dataclass(frozen=True)
class SnapshotInfo:
    """A saved copy of a sandbox's files (/workspace and /tmp); new sandboxes start from it."""

    id: str
    sandbox: str
    """The sandbox it was taken from."""
    name: str
    kind: str
    """'manual', or 'archive' (the reaper's, of a long-paused sandbox)."""
    state: str
    provider: str
    template: str
    size_bytes: int
    """Bytes stored (compressed)."""
    created_at: datetime | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SnapshotInfo:
        return cls(
            id=data["id"],
            sandbox=data.get("sandbox", ""),
            name=data.get("name", ""),
            kind=data.get("kind", ""),
            state=data.get("state", ""),
            provider=data.get("provider", ""),
            template=data.get("template", ""),
            size_bytes=int(data.get("size_bytes") or 0),
            created_at=_time(data.get("created_at")),
        )


@dataclass(frozen=True)
class SandboxStats:
    """Resource gauges of a running sandbox."""

    cpu_percent: float
    memory_bytes: int
    disk_bytes: int
    net_rx_bytes: int
    net_tx_bytes: int
    uptime_s: float
    process_count: int = 0

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SandboxStats:
        return cls(
            cpu_percent=float(data.get("cpu_percent", 0)),
            memory_bytes=int(data.get("memory_bytes", 0)),
            disk_bytes=int(data.get("disk_bytes", 0)),
            net_rx_bytes=int(data.get("net_rx_bytes", 0)),
            net_tx_bytes=int(data.get("net_tx_bytes", 0)),
            uptime_s=float(data.get("uptime_s", 0)),
            process_count=int(data.get("process_count", 0)),
        )


@dataclass(frozen=True)
class CompileStep:
    """The compile step of a compiled language (C, C++, Go, Rust, Java, TypeScript via tsc)."""

    stdout: str
    stderr: str
    """The compiler's messages (each stream at most 64 KiB)."""
    exit_code: int
    duration_ms: float
    timed_out: bool = False
    """The compile ran out of its own time limit (compile_timeout_s)."""

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> CompileStep | None:
        if not data:
            return None
        return cls(
            stdout=data.get("stdout", ""),
            stderr=data.get("stderr", ""),
            exit_code=int(data.get("exit_code", -1)),
            duration_ms=float(data.get("duration_ms", 0)),
            timed_out=bool(data.get("timed_out")),
        )


@dataclass(frozen=True)
class Language:
    """A language a sandbox runs (Sandbox.languages())."""

    name: str
    """What `language` takes: python, node, typescript, bash, c, cpp, go, rust, java, ..."""
    label: str
    compiled: bool
    extensions: tuple[str, ...]
    aliases: tuple[str, ...]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Language:
        return cls(
            name=data["name"],
            label=data.get("label", data["name"]),
            compiled=bool(data.get("compiled")),
            extensions=tuple(data.get("extensions", ())),
            aliases=tuple(data.get("aliases", ())),
        )


@dataclass(frozen=True)
class CommandResult:
    """A finished command or code run."""

    stdout: str
    """UTF-8 decoded; invalid bytes become U+FFFD (the server's output is text)."""
    stderr: str
    exit_code: int
    """Negative N: killed by signal N (-9 after a timeout or a kill)."""
    duration_ms: float
    """Wall time, measured by the server."""
    timed_out: bool = False
    truncated: bool = False
    """Output beyond the server's per-stream limit was dropped."""
    cancelled: bool = False
    """Killed through the SDK (handle.kill())."""
    language: str | None = None
    """For run_code: the language it ran as."""
    compile: CompileStep | None = None
    """For run_code of a compiled language: its compile step. When it failed, the result's
    stdout, stderr and exit_code are the compiler's and nothing ran."""
    pid: int | None = None
    """For streamed runs: the process id inside the sandbox."""
    stdout_bytes: bytes | None = None
    """The exact bytes written to stdout (binary output survives); None for streamed runs,
    whose output arrives as text."""
    stderr_bytes: bytes | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CommandResult:
        stdout: str = data.get("stdout", "")
        stderr: str = data.get("stderr", "")
        raw_out = raw_err = None
        if data.get("encoding") == "base64":
            raw_out, raw_err = base64.b64decode(stdout), base64.b64decode(stderr)
            stdout = raw_out.decode("utf-8", errors="replace")
            stderr = raw_err.decode("utf-8", errors="replace")
        return cls(
            stdout=stdout,
            stderr=stderr,
            stdout_bytes=raw_out,
            stderr_bytes=raw_err,
            exit_code=int(data.get("exit_code", -1)),
            duration_ms=float(data.get("duration_ms", 0)),
            timed_out=bool(data.get("timed_out")),
            truncated=bool(data.get("truncated")),
            language=data.get("language"),
            compile=CompileStep.from_json(data.get("compile")),
        )


@dataclass(frozen=True)
class RunResult:
    """A one-shot judge run (POST /api/v1/run)."""

    verdict: str
    """'ok', 'compile_error', 'runtime_error', 'timeout', 'memory_limit' or 'output_limit'."""
    stdout: str
    stderr: str
    exit_code: int
    duration_ms: float
    language: str | None = None
    compile: CompileStep | None = None
    """The compile step of a compiled language (its output is the result's on
    'compile_error')."""
    cpu_time_ms: float | None = None
    peak_memory_bytes: int | None = None
    timed_out: bool = False
    truncated: bool = False

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunResult:
        return cls(
            verdict=data["verdict"],
            stdout=data.get("stdout", ""),
            stderr=data.get("stderr", ""),
            exit_code=int(data.get("exit_code", -1)),
            duration_ms=float(data.get("duration_ms", 0)),
            language=data.get("language"),
            compile=CompileStep.from_json(data.get("compile")),
            cpu_time_ms=data.get("cpu_time_ms"),
            peak_memory_bytes=data.get("peak_memory_bytes"),
            timed_out=bool(data.get("timed_out")),
            truncated=bool(data.get("truncated")),
        )


@dataclass(frozen=True)
class FileEntry:
    """A file, directory or symlink in the sandbox."""

    name: str
    path: str
    """Relative to the workspace, '/'-separated."""
    type: str
    """'file', 'dir' or 'symlink'."""
    size_bytes: int
    mtime: datetime | None

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FileEntry:
        mtime = data.get("mtime")
        return cls(
            name=data["name"],
            path=data["path"],
            type=data["type"],
            size_bytes=int(data.get("size") or 0),
            mtime=datetime.fromtimestamp(float(mtime)).astimezone() if mtime else None,
        )


@dataclass(frozen=True)
class FileEvent:
    """A change seen by a watcher."""

    type: str
    """'created', 'modified', 'deleted' or 'moved'."""
    path: str
    """Relative to the workspace."""
    is_dir: bool = False
    old_path: str | None = None
    """For 'moved'."""


@dataclass(frozen=True)
class ProcessInfo:
    """A process started with the processes API."""

    pid: int
    command: str
    running: bool
    exit_code: int | None = None
    started_at: datetime | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProcessInfo:
        started = data.get("started_at")
        return cls(
            pid=int(data["pid"]),
            command=str(data.get("command", "")),
            running=bool(data.get("running")),
            exit_code=data.get("exit_code"),
            started_at=datetime.fromtimestamp(float(started)).astimezone() if started else None,
        )


@dataclass(frozen=True)
class BackgroundOutput:
    """What a background command (`commands.start`) wrote since the offsets asked for."""

    stdout_bytes: bytes
    stderr_bytes: bytes
    stdout_offset: int
    """Bytes of stdout read so far: pass it back to get only what comes next."""
    stderr_offset: int
    running: bool | None
    """None when the sandbox no longer lists the process."""
    exit_code: int | None = None

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", errors="replace")

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BackgroundOutput:
        return cls(
            stdout_bytes=base64.b64decode(data.get("stdout", "")),
            stderr_bytes=base64.b64decode(data.get("stderr", "")),
            stdout_offset=int(data.get("stdout_offset", 0)),
            stderr_offset=int(data.get("stderr_offset", 0)),
            running=data.get("running"),
            exit_code=data.get("exit_code"),
        )


@dataclass(frozen=True)
class TerminalInfo:
    """A terminal (a shell on a PTY) in the sandbox."""

    id: str
    sandbox_id: str
    ws_path: str
    cols: int
    rows: int
    shell: str | None
    running: bool
    exit_code: int | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TerminalInfo:
        return cls(
            id=data["id"],
            sandbox_id=data["sandbox_id"],
            ws_path=data["ws_path"],
            cols=int(data.get("cols", 80)),
            rows=int(data.get("rows", 24)),
            shell=data.get("shell"),
            running=bool(data.get("running")),
            exit_code=data.get("exit_code"),
        )


@dataclass(frozen=True)
class SandboxToken:
    """A short-lived token for one sandbox."""

    token: str
    scopes: tuple[str, ...]
    expires_at: datetime | None


@dataclass(frozen=True)
class ProviderInfo:
    name: str
    default: bool
    capabilities: tuple[str, ...]
    healthy: bool
    limits: dict[str, Any] = field(default_factory=dict)
