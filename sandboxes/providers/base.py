"""The one provider interface every sandbox backend implements.

The rest of Sandpit only ever sees these dataclasses and errors: SDK objects
and provider-specific shapes never leave an adapter module.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, runtime_checkable

from common.coded import CodedError

# ---------------------------------------------------------------------------
# Errors: one tree, rendered in the one error shape by common/errors.py
# ---------------------------------------------------------------------------


class ProviderError(CodedError):
    """Base of every error a provider raises. `code` is the API error code."""

    code = "provider_error"
    status_code = 502

    def __init__(self, message: str = "") -> None:
        super().__init__(message or (self.__class__.__doc__ or self.code).strip())


class ProviderUnavailable(ProviderError):
    """The provider's backend (bwrap, the Docker engine, a cloud API) cannot be reached."""

    code = "provider_unavailable"
    status_code = 503


class ProviderNotConfigured(ProviderError):
    """The provider lacks its configuration (for example a missing credential variable)."""

    code = "provider_not_configured"
    status_code = 503


class CapabilityNotSupported(ProviderError):
    """The provider does not support this operation."""

    code = "not_supported"
    status_code = 501


class SandboxGone(ProviderError):
    """The sandbox no longer exists in the provider."""

    code = "sandbox_gone"
    status_code = 410


class FileNotFound(ProviderError):
    """No such file or directory in the sandbox."""

    code = "file_not_found"
    status_code = 404


class PathNotAllowed(ProviderError):
    """The path escapes the workspace (traversal or symlink) or is malformed."""

    code = "path_not_allowed"
    status_code = 400


class FileConflict(ProviderError):
    """The operation conflicts with the file system (not a directory, not empty, exists)."""

    code = "file_conflict"
    status_code = 409


class FileTooLarge(ProviderError):
    """The file is larger than the configured limit."""

    code = "file_too_large"
    status_code = 413


class ProcessNotFound(ProviderError):
    """No such process in the sandbox."""

    code = "process_not_found"
    status_code = 404


class InvalidRequest(ProviderError):
    """The request is malformed for this provider (unknown language, bad signal...)."""

    code = "invalid_request"
    status_code = 400


class ResourceExhausted(ProviderError):
    """The sandbox hit a resource limit (disk full, too many processes)."""

    code = "resource_exhausted"
    status_code = 507


# ---------------------------------------------------------------------------
# Value objects
# ---------------------------------------------------------------------------


class SandboxState(enum.StrEnum):
    RUNNING = "running"
    STOPPED = "stopped"
    ERROR = "error"
    GONE = "gone"


class Capability(enum.StrEnum):
    """Operations a provider may or may not support; missing ones answer 501."""

    EXEC = "exec"
    FILES = "files"
    PROCESSES = "processes"
    STATS = "stats"
    TIMEOUT = "timeout"
    NETWORK = "network"
    PTY = "pty"
    WATCH = "watch"
    PORTS = "ports"
    PAUSE = "pause"
    """Freeze and thaw every process, memory kept (SnapshotProvider.pause/resume)."""
    SNAPSHOT = "snapshot"
    """Save the writable file system to an archive and start sandboxes from one
    (SnapshotProvider.snapshot, SandboxSpec.restore_from)."""


@dataclass(frozen=True)
class Resources:
    """Limits for one sandbox. Units are in the names."""

    memory_mb: int = 512
    """Memory limit for all processes of the sandbox together."""
    cpu_count: float = 1.0
    """CPU share (1.0 = one core)."""
    pids: int = 128
    """Maximum number of processes/threads alive at once."""
    disk_mb: int = 512
    """Largest single file a process may write (and the workspace quota where enforced)."""
    open_files: int = 1024
    """RLIMIT_NOFILE for every process (Linux's usual soft limit; the local agent has it too)."""
    cpu_time_s: int = 600
    """CPU seconds a single process may use (RLIMIT_CPU)."""


@dataclass(frozen=True)
class SandboxSpec:
    """What to create. `sandbox_id` is Sandpit's id, used for labels and paths."""

    sandbox_id: str
    template: str = "default"
    timeout_s: int = 900
    """Idle timeout: no activity for this long ends the sandbox. Sandpit's reaper enforces
    it on every provider, because only Sandpit sees all activity (API calls, keystrokes,
    previews); a provider must not turn it into a kill timer of its own."""
    lifetime_s: int = 24 * 3600
    """The longest the sandbox may live, activity or not. A provider with its own kill
    timer (the cloud ones) sets that timer to this, as a backstop should Sandpit stop."""
    network: bool = False
    """Outbound network allowed. False means loopback only."""
    resources: Resources = field(default_factory=Resources)
    env: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    runtime: str = ""
    """The Docker runtime to run under ('runc', 'runsc' for gVisor); empty = the provider's
    default. Providers without runtimes ignore it."""
    image: str = ""
    """A template's Docker image to start from (docker); empty: the provider's own image."""
    rootfs: str = ""
    """A template's read-only root file system directory (local, see local/rootfs.py);
    empty: the host's /usr and /etc."""
    restore_from: str = ""
    """A snapshot archive (SnapshotResult.location) whose files the sandbox starts with, in
    /workspace and /tmp; empty: a fresh sandbox. Only for providers with Capability.SNAPSHOT."""


@dataclass(frozen=True)
class SandboxHandle:
    """A live sandbox in a provider."""

    provider: str
    provider_id: str
    """The provider's own id (a container id, a directory name, a cloud id)."""
    state: SandboxState
    created_at: datetime
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SnapshotResult:
    """An archive a provider wrote of a sandbox's writable file system."""

    location: str
    """Where it is (the archive's path); what SandboxSpec.restore_from takes."""
    size_bytes: int
    """Bytes stored (compressed)."""
    content_bytes: int
    """Bytes of the uncompressed archive (file contents plus headers)."""


@dataclass(frozen=True)
class ExecRequest:
    """One command. `args is None` means `command` is a shell string run by `sh -c`."""

    command: str
    args: Sequence[str] | None = None
    cwd: str | None = None
    """Relative to the workspace when not absolute."""
    env: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 30.0
    stdin: bytes | None = None
    max_output_bytes: int = 1_048_576
    """Per stream; beyond it output is dropped and the truncated flag set."""


@dataclass(frozen=True)
class ExecResult:
    stdout: bytes
    stderr: bytes
    exit_code: int
    """Process exit status; negative N means killed by signal N; -9 after a timeout."""
    duration_ms: float
    timed_out: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    cpu_time_ms: float | None = None
    """User+system CPU time of the command's process tree, where the provider measures it."""
    peak_memory_bytes: int | None = None
    """Peak resident memory, where the provider measures it."""
    oom_killed: bool = False

    @property
    def truncated(self) -> bool:
        return self.stdout_truncated or self.stderr_truncated


@dataclass(frozen=True)
class ExecEvent:
    """One event of a streamed command (`StreamingProvider.exec_stream`)."""

    type: str
    """'stdout', 'stderr' or 'exit' (always the last)."""
    data: bytes = b""
    """Output bytes, for 'stdout' and 'stderr'."""
    exit_code: int | None = None
    """For 'exit': as ExecResult.exit_code; None when the sandbox went away first."""
    timed_out: bool = False
    duration_ms: float | None = None


@dataclass(frozen=True)
class FileEntry:
    name: str
    path: str
    """Relative to the workspace, '/'-separated, no leading slash."""
    type: str
    """'file', 'dir' or 'symlink'."""
    size: int
    """Bytes."""
    mtime: float
    """Seconds since the epoch."""


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    """The pid as seen inside the sandbox (or the provider's process handle)."""
    command: str
    running: bool
    exit_code: int | None = None
    started_at: float | None = None
    """Seconds since the epoch."""


@dataclass(frozen=True)
class SandboxStats:
    cpu_percent: float
    memory_bytes: int
    disk_bytes: int
    net_rx_bytes: int
    net_tx_bytes: int
    uptime_s: float
    process_count: int = 0


@dataclass(frozen=True)
class ProviderHealth:
    ok: bool
    detail: str
    latency_ms: float


@dataclass(frozen=True)
class OpenPort:
    port: int
    """TCP port listening inside the sandbox."""
    address: str = "0.0.0.0"


@dataclass(frozen=True)
class FileEvent:
    type: str
    """'created', 'modified', 'deleted' or 'moved'."""
    path: str
    """Relative to the workspace."""
    is_dir: bool = False
    old_path: str | None = None
    """For 'moved': where it came from."""


# ---------------------------------------------------------------------------
# Live sessions: a PTY and a byte stream to a port
# ---------------------------------------------------------------------------


class PtySession(Protocol):
    """An interactive terminal whose PTY lives inside the sandbox.

    `fileno()` is a non-blocking descriptor the caller may register with an
    asyncio loop (add_reader); `read()` returns b"" at end of stream.
    """

    def fileno(self) -> int: ...

    def read(self, max_bytes: int = 65536) -> bytes:
        """Read what is available (non-blocking). b"" means the terminal ended;
        raises BlockingIOError when nothing is ready yet."""
        ...

    def write(self, data: bytes) -> None: ...

    def resize(self, cols: int, rows: int) -> None: ...

    def exit_code(self) -> int | None:
        """None while running."""
        ...

    def close(self) -> None:
        """Kill the shell and its process tree; idempotent."""
        ...


class ExecStream(Protocol):
    """A running command whose output arrives as it is written, stdout and stderr apart.

    `fileno()` becomes readable when `read_events()` has something (register it with an
    asyncio loop); closing the stream kills the command's process tree."""

    pid: int
    """The command's pid inside the sandbox."""

    def fileno(self) -> int: ...

    def read_events(self) -> list[ExecEvent]:
        """What has arrived (non-blocking); raises BlockingIOError when nothing has. The
        last event is 'exit'; after it, []."""
        ...

    def write_stdin(self, data: bytes) -> None: ...

    def close_stdin(self) -> None: ...

    def signal(self, signal: int) -> None:
        """Send `signal` to the command's process group."""
        ...

    def close(self) -> None:
        """Kill the command's process tree; idempotent."""
        ...


class PortStream(Protocol):
    """A connected byte stream to a TCP port inside the sandbox (for previews).

    `fileno()` carries exactly the port's bytes, no framing or TLS records: callers select
    on it, or hand a duplicate of it to asyncio or a WebSocket client (the preview proxy
    does). A provider whose transport frames or encrypts bridges it onto a socketpair.

    A stream may carry `host_header`: the Host an HTTP client must send through it (a
    cloud edge that routes by host); without it, `localhost:<port>`."""

    def fileno(self) -> int: ...

    def recv(self, max_bytes: int = 65536) -> bytes: ...

    def sendall(self, data: bytes) -> None: ...

    def close(self) -> None: ...


# ---------------------------------------------------------------------------
# The provider
# ---------------------------------------------------------------------------


@runtime_checkable
class WarmPooled(Protocol):
    """A provider keeping started sandboxes for `create` to claim (local jails, docker
    containers). Its pool fills from the first create on, or from `warm_pool_start`."""

    def warm_pool_start(self) -> None:
        """Start filling the pool now (a no-op without one)."""
        ...


class WarmReservation(Protocol):
    """A started sandbox a WarmReserving provider set aside for one create, still
    unchanged: the create either adopts it or releases it, once."""

    provider_id: str
    """What `adopt` returns as SandboxHandle.provider_id."""
    engine: str
    """The engine it runs on ('' for providers without engines)."""

    def adopt(self) -> SandboxHandle:
        """The sandbox the create's spec asked for, made of the reserved one or, should
        that fail, started afresh under the same provider_id; raises ProviderError as
        `create` does."""
        ...

    def release(self) -> None:
        """Not needed after all (the create was refused): back to the pool, unused."""
        ...


@runtime_checkable
class WarmReserving(Protocol):
    """A provider whose warm pool can set a started sandbox aside for a create before the
    create is admitted, so that the create can record its sandbox as running in the write
    that admits it instead of in a second one."""

    def warm_reserve(self, spec: SandboxSpec) -> WarmReservation | None:
        """A warm sandbox set aside for `spec`, or None when none is idle or `spec` needs
        one of its own (then `create` as usual)."""
        ...


@runtime_checkable
class SandboxProvider(Protocol):
    """Every method is synchronous and may block; async callers use a thread.

    `provider_id` arguments are what `create` returned in SandboxHandle.provider_id.
    Methods on a sandbox that no longer exists raise SandboxGone.
    """

    name: str
    capabilities: frozenset[Capability]

    # lifecycle
    def create(self, spec: SandboxSpec) -> SandboxHandle: ...

    def get(self, provider_id: str) -> SandboxHandle:
        """Raises SandboxGone when it does not exist."""
        ...

    def list_sandboxes(self) -> list[SandboxHandle]:
        """Every sandbox this provider (this installation) owns, including orphans."""
        ...

    def destroy(self, provider_id: str) -> bool:
        """Destroy and free everything. False when it was already gone."""
        ...

    def set_timeout(self, provider_id: str, timeout_s: int) -> None:
        """Renew the provider's own kill timer to `timeout_s` seconds from now (the
        sandbox's remaining lifetime, see SandboxSpec.lifetime_s). The idle timeout is not
        the provider's: a provider without a timer may ignore this."""
        ...

    def stats(self, provider_id: str) -> SandboxStats: ...

    def health(self) -> ProviderHealth: ...

    # execution
    def exec(self, provider_id: str, request: ExecRequest) -> ExecResult: ...

    # files (paths relative to the workspace, or absolute inside it)
    def read_file(
        self, provider_id: str, path: str, offset: int = 0, length: int | None = None
    ) -> bytes: ...

    def write_file(self, provider_id: str, path: str, data: bytes) -> FileEntry:
        """Creates parent directories."""
        ...

    def mkdir(self, provider_id: str, path: str) -> FileEntry:
        """Recursive; succeeds when it already exists as a directory."""
        ...

    def list_files(
        self, provider_id: str, path: str, recursive: bool = False
    ) -> list[FileEntry]: ...

    def stat(self, provider_id: str, path: str) -> FileEntry:
        """Raises FileNotFound."""
        ...

    def exists(self, provider_id: str, path: str) -> bool: ...

    def remove(self, provider_id: str, path: str, recursive: bool = False) -> None: ...

    def move(self, provider_id: str, src: str, dst: str) -> FileEntry: ...

    # processes
    def start_process(
        self,
        provider_id: str,
        command: str,
        args: Sequence[str] | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ProcessInfo: ...

    def list_processes(self, provider_id: str) -> list[ProcessInfo]: ...

    def signal_process(self, provider_id: str, pid: int, signal: int) -> None: ...

    # real-time
    def open_pty(
        self,
        provider_id: str,
        cols: int = 80,
        rows: int = 24,
        shell: str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> PtySession: ...

    def open_ports(self, provider_id: str) -> list[OpenPort]:
        """TCP ports currently listening inside the sandbox."""
        ...

    def connect_port(self, provider_id: str, port: int) -> PortStream:
        """A byte stream to 127.0.0.1:port inside the sandbox (works without network)."""
        ...

    def watch(
        self, provider_id: str, path: str, recursive: bool = True
    ) -> Iterator[list[FileEvent]]:
        """Blocking iterator of event batches until closed (generator .close())."""
        ...


@runtime_checkable
class StreamingProvider(SandboxProvider, Protocol):
    """A provider that streams a command itself (local, docker). Streamed runs on the others
    go through a PTY and sandboxes/programs/exec_runner.py (see sandboxes/streaming.py)."""

    def exec_stream(self, provider_id: str, request: ExecRequest) -> ExecStream:
        """Start `request` and stream it (see ExecStream). `request.stdin`, when given, is
        written first; `timeout_s` kills the tree (exit event with timed_out);
        `max_output_bytes` does not apply."""
        ...


@runtime_checkable
class SnapshotProvider(SandboxProvider, Protocol):
    """A provider that pauses sandboxes and snapshots their files (local, docker); the
    services use it only after checking Capability.PAUSE or Capability.SNAPSHOT."""

    def pause(self, provider_id: str) -> None:
        """Freeze every process of the sandbox; memory stays. Idempotent."""
        ...

    def resume(self, provider_id: str) -> None:
        """Thaw what `pause` froze. Idempotent."""
        ...

    def snapshot(self, provider_id: str, target: str, max_bytes: int) -> SnapshotResult:
        """Archive /workspace and /tmp (everything the sandbox can write) to the new file
        `target`, running or paused (a paused sandbox stays paused). Setuid and setgid bits
        are dropped. Raises ResourceExhausted once more than `max_bytes` would be stored
        (nothing is left at `target` then), SandboxGone."""
        ...

    def snapshot_remove(self, location: str) -> bool:
        """Delete a snapshot archive (a file on Sandpit's host for local and docker); False
        when it was already gone."""
        ...
