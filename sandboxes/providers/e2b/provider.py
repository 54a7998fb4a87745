"""E2BProvider: the provider Protocol over the e2b SDK (lifecycle, commands, files,
processes; the sessions it returns are in sessions.py). `_translate` is the one place
e2b errors become ours."""

from __future__ import annotations

import contextlib
import posixpath
import shlex
import signal
import socket
import ssl
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sandboxes.providers.base import (
    Capability,
    ExecRequest,
    ExecResult,
    FileConflict,
    FileEntry,
    FileEvent,
    FileNotFound,
    InvalidRequest,
    OpenPort,
    PathNotAllowed,
    PortStream,
    ProcessInfo,
    ProcessNotFound,
    ProviderError,
    ProviderHealth,
    ProviderNotConfigured,
    ProviderUnavailable,
    PtySession,
    ResourceExhausted,
    SandboxGone,
    SandboxHandle,
    SandboxSpec,
    SandboxState,
    SandboxStats,
)
from sandboxes.providers.cloud.common import (
    WorkspacePaths,
    check_env,
    command_line,
    exit_code_from,
    import_sdk,
)

from .sessions import E2BPortStream, E2BPtySession, E2BWatch

WORKSPACE = "/home/user"
"""E2B's default user's home: the SDK's relative paths and commands start here."""
_HELPER_TIMEOUT_S = 30.0
_STDIN_CHUNK = 64 * 1024
# Stop a process and every descendant (found through /proc/<pid>/task/*/children), then kill
# them: stopping first means nothing forks a new child while we walk the tree.
_KILL_TREE = (
    "k(){ kill -STOP $1 2>/dev/null; "
    "for c in $(cat /proc/$1/task/*/children 2>/dev/null); do k $c; done; "
    "kill -KILL $1 2>/dev/null; }; k {pid}"
)
_LISTEN = "0A"


def _kind(info: Any) -> str:
    """'file', 'dir' or 'symlink' from an SDK EntryInfo (its type may be None)."""
    return str(getattr(info.type, "value", info.type) or "file")


class _Capped:
    """Collects decoded output up to a byte cap; the rest is counted as truncated."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()
        self.truncated = False

    def add(self, text: str | bytes) -> None:
        chunk = text.encode() if isinstance(text, str) else text
        room = self.limit - len(self.data)
        if len(chunk) > room:
            self.truncated = True
            chunk = chunk[: max(room, 0)]
        self.data += chunk


class E2BProvider:
    """Sandboxes in E2B's cloud (Firecracker microVMs) through the official SDK.

    `sandbox_class` replaces `e2b.Sandbox` (tests pass a local fake with the same
    surface); everything else, including the exception types, comes from the SDK.
    """

    name = "e2b"
    # E2B pauses and snapshots in its own cloud; Sandpit does not drive that (yet).
    capabilities = frozenset(Capability) - {Capability.PAUSE, Capability.SNAPSHOT}

    def __init__(
        self,
        api_key: str,
        template: str = "base",
        domain: str | None = None,
        installation: str = "default",
        sandbox_class: Any = None,
    ) -> None:
        if not api_key:
            raise ProviderNotConfigured(
                "The e2b provider needs the E2B_API_KEY environment variable."
            )
        self._sdk = import_sdk("e2b", "e2b", "e2b")
        self._cls = sandbox_class or self._sdk.Sandbox
        self._opts: dict[str, Any] = {"api_key": api_key}
        if domain:
            self._opts["domain"] = domain
        self.template = template
        self.installation = installation
        self._paths = WorkspacePaths(WORKSPACE)
        self._connected: dict[str, Any] = {}
        self._lock = threading.Lock()

    # -- plumbing ----------------------------------------------------------------

    @contextlib.contextmanager
    def _translate(self, provider_id: str | None = None, files: bool = False) -> Iterator[None]:
        """The one place SDK errors become ours. `files` marks filesystem calls, where
        a NotFound means a missing path rather than a missing sandbox."""
        sdk = self._sdk
        try:
            yield
        except ProviderError:
            raise
        except sdk.AuthenticationException as exc:
            raise ProviderNotConfigured(f"E2B rejected E2B_API_KEY: {exc}") from exc
        except (sdk.SandboxNotFoundException, sdk.SandboxNotRunningException) as exc:
            self._forget(provider_id)
            raise SandboxGone(f"Sandbox {provider_id} no longer exists in E2B.") from exc
        except sdk.NotFoundException as exc:
            if files:
                raise FileNotFound(str(exc) or "No such file or directory.") from exc
            self._forget(provider_id)
            raise SandboxGone(f"Sandbox {provider_id} no longer exists in E2B.") from exc
        except sdk.InvalidArgumentException as exc:
            if files:
                raise FileConflict(str(exc)) from exc
            raise InvalidRequest(str(exc)) from exc
        except sdk.NotEnoughSpaceException as exc:
            raise ResourceExhausted(str(exc)) from exc
        except (sdk.RateLimitException, sdk.TimeoutException) as exc:
            raise ProviderUnavailable(f"E2B did not answer in time: {exc}") from exc
        except sdk.SandboxException as exc:
            raise ProviderError(f"E2B error: {exc}") from exc
        except (ConnectionError, TimeoutError, OSError) as exc:
            raise ProviderUnavailable(f"E2B cannot be reached: {exc}") from exc
        except Exception as exc:
            # The SDK's HTTP layer (httpx/pyqwest) raises its own transport errors.
            if type(exc).__module__.split(".")[0] in {"httpx", "httpcore", "pyqwest"}:
                raise ProviderUnavailable(f"E2B cannot be reached: {exc}") from exc
            raise

    def _forget(self, provider_id: str | None) -> None:
        if provider_id is not None:
            with self._lock:
                self._connected.pop(provider_id, None)

    def _sandbox(self, provider_id: str) -> Any:
        """A connected SDK sandbox (cached); SandboxGone when it does not exist."""
        with self._lock:
            sandbox = self._connected.get(provider_id)
        if sandbox is None:
            with self._translate(provider_id):
                sandbox = self._cls.connect(provider_id, **self._opts)
            with self._lock:
                self._connected[provider_id] = sandbox
        return sandbox

    def _handle(self, info: Any) -> SandboxHandle:
        state = str(getattr(info.state, "value", info.state)).lower()
        started = info.started_at
        if started.tzinfo is None:
            started = started.replace(tzinfo=UTC)
        return SandboxHandle(
            provider=self.name,
            provider_id=info.sandbox_id,
            state=SandboxState.RUNNING if state == "running" else SandboxState.STOPPED,
            created_at=started,
            labels=dict(info.metadata or {}),
        )

    def _wait(self, handle: Any, **callbacks: Any) -> tuple[int, str | None]:
        """Wait for a command handle: (exit code in our convention, envd's error text)."""
        sdk = self._sdk
        try:
            result = handle.wait(**callbacks)
        except sdk.CommandExitException as exc:
            return exit_code_from(exc.exit_code, exc.error), exc.error
        return exit_code_from(result.exit_code, result.error), result.error

    def _helper(self, provider_id: str, command: str) -> str:
        """Run one of our own short commands; its stdout. ProviderError if it fails."""
        sandbox = self._sandbox(provider_id)
        out = _Capped(1 << 20)
        err = _Capped(1 << 16)
        with self._translate(provider_id):
            handle = sandbox.commands.run(
                command, background=True, timeout=_HELPER_TIMEOUT_S, retain_output=False
            )
            code, _ = self._wait(handle, on_stdout=out.add, on_stderr=err.add)
        if code != 0:
            raise ProviderError(f"E2B helper command failed ({code}): {err.data.decode()!r}")
        return out.data.decode()

    def _real(self, provider_id: str, path: str, follow_last: bool = True) -> str:
        """The absolute path after a lexical check and a `realpath` inside the sandbox, so a
        symlink cannot lead outside the workspace. With follow_last=False the final
        component is kept (stat/remove/move act on a link itself)."""
        lexical = self._paths.resolve(path)
        if lexical == self._paths.root:
            return lexical
        target = lexical if follow_last else posixpath.dirname(lexical)
        real = self._helper(provider_id, f"realpath -m -- {shlex.quote(target)}").strip()
        if not self._paths.inside(real):
            raise PathNotAllowed(f"'{path}' leads outside the workspace through a symlink.")
        return real if follow_last else posixpath.join(real, posixpath.basename(lexical))

    def _entry(self, info: Any, path: str) -> FileEntry:
        kind = _kind(info)
        return FileEntry(
            name=posixpath.basename(path),
            path=self._paths.relative(path),
            type=kind if kind in ("file", "dir", "symlink") else "file",
            size=int(info.size),
            mtime=info.modified_time.timestamp(),
        )

    # -- lifecycle ------------------------------------------------------------------

    def create(self, spec: SandboxSpec) -> SandboxHandle:
        """A new sandbox from `spec.template` ('default' means the configured template).
        E2B sizes CPU and memory per template, so `spec.resources` is not applied."""
        metadata = {
            **spec.labels,
            "sandpit.installation": self.installation,
            "sandpit.sandbox_id": spec.sandbox_id,
        }
        template = self.template if spec.template in ("", "default") else spec.template
        with self._translate():
            sandbox = self._cls.create(
                template=template,
                # E2B's timeout is a kill timer: the lifetime, never the idle timeout.
                timeout=spec.lifetime_s,
                metadata=metadata,
                envs=check_env(spec.env),
                allow_internet_access=spec.network,
                **self._opts,
            )
            info = sandbox.get_info()
        with self._lock:
            self._connected[info.sandbox_id] = sandbox
        return self._handle(info)

    def get(self, provider_id: str) -> SandboxHandle:
        with self._translate(provider_id):
            info = self._cls.get_info(provider_id, **self._opts)
        if (info.metadata or {}).get("sandpit.installation") != self.installation:
            raise SandboxGone(f"Sandbox {provider_id} does not belong to this installation.")
        return self._handle(info)

    def list_sandboxes(self) -> list[SandboxHandle]:
        query = self._sdk.SandboxQuery(metadata={"sandpit.installation": self.installation})
        handles: list[SandboxHandle] = []
        with self._translate():
            paginator = self._cls.list(query=query, **self._opts)
            while paginator.has_next:
                handles.extend(self._handle(info) for info in paginator.next_items())
        return handles

    def destroy(self, provider_id: str) -> bool:
        self._forget(provider_id)
        with self._translate(provider_id):
            return bool(self._cls.kill(provider_id, **self._opts))

    def set_timeout(self, provider_id: str, timeout_s: int) -> None:
        """Renew E2B's kill timer: it kills the sandbox `timeout_s` seconds from now unless
        extended again (Sandpit passes the remaining lifetime)."""
        with self._translate(provider_id):
            self._cls.set_timeout(provider_id, timeout_s, **self._opts)

    def stats(self, provider_id: str) -> SandboxStats:
        """The latest E2B metrics sample (zeros before the first one). E2B does not report
        network counters, so those are 0."""
        sandbox = self._sandbox(provider_id)
        with self._translate(provider_id):
            metrics = self._cls.get_metrics(provider_id, **self._opts)
            info = self._cls.get_info(provider_id, **self._opts)
            processes = sandbox.commands.list()
        last = metrics[-1] if metrics else None
        started = info.started_at if info.started_at.tzinfo else info.started_at.replace(tzinfo=UTC)
        return SandboxStats(
            cpu_percent=float(last.cpu_used_pct) if last else 0.0,
            memory_bytes=int(last.mem_used) if last else 0,
            disk_bytes=int(last.disk_used) if last else 0,
            net_rx_bytes=0,
            net_tx_bytes=0,
            uptime_s=max(0.0, (datetime.now(UTC) - started).total_seconds()),
            process_count=len(processes),
        )

    def health(self) -> ProviderHealth:
        """One authenticated list call. Raises ProviderUnavailable/NotConfigured on failure."""
        started = time.perf_counter()
        with self._translate():
            paginator = self._cls.list(limit=1, **self._opts)
            if paginator.has_next:
                paginator.next_items()
        latency = (time.perf_counter() - started) * 1000.0
        return ProviderHealth(ok=True, detail="e2b api reachable", latency_ms=latency)

    # -- execution ----------------------------------------------------------------------

    def exec(self, provider_id: str, request: ExecRequest) -> ExecResult:
        """One command to completion. After `timeout_s` the process tree is killed and the
        result says timed_out with exit code -9. Output is decoded by envd as UTF-8, so
        invalid bytes in a command's output arrive as U+FFFD."""
        sandbox = self._sandbox(provider_id)
        sdk = self._sdk
        cwd = self._paths.cwd(request.cwd)
        out, err = _Capped(request.max_output_bytes), _Capped(request.max_output_bytes)
        timed_out = False
        started = time.monotonic()
        with self._translate(provider_id):
            handle = sandbox.commands.run(
                command_line(request),
                background=True,
                envs=check_env(request.env),
                cwd=cwd,
                stdin=request.stdin is not None,
                timeout=request.timeout_s,
                retain_output=False,
            )
            if request.stdin is not None:
                for i in range(0, len(request.stdin), _STDIN_CHUNK):
                    handle.send_stdin(request.stdin[i : i + _STDIN_CHUNK])
                handle.close_stdin()
            try:
                code, _ = self._wait(handle, on_stdout=out.add, on_stderr=err.add)
            except (sdk.SandboxNotRunningException, sdk.SandboxUnreachableException):
                raise
            except sdk.TimeoutException:
                timed_out, code = True, -int(signal.SIGKILL)
                self._kill_tree(provider_id, handle.pid)
        return ExecResult(
            stdout=bytes(out.data),
            stderr=bytes(err.data),
            exit_code=code,
            duration_ms=(time.monotonic() - started) * 1000.0,
            timed_out=timed_out,
            stdout_truncated=out.truncated,
            stderr_truncated=err.truncated,
        )

    def _kill_tree(self, provider_id: str, pid: int) -> None:
        sandbox = self._sandbox(provider_id)
        with contextlib.suppress(ProviderError):
            self._helper(provider_id, _KILL_TREE.replace("{pid}", str(int(pid))))
        with contextlib.suppress(ProviderError), self._translate(provider_id):
            sandbox.commands.kill(pid)

    # -- files ----------------------------------------------------------------------------

    def read_file(
        self, provider_id: str, path: str, offset: int = 0, length: int | None = None
    ) -> bytes:
        """The SDK reads whole files; offset/length are applied after the download."""
        real = self._real(provider_id, path)
        sandbox = self._sandbox(provider_id)
        with self._translate(provider_id, files=True):
            if _kind(sandbox.files.get_info(real)) == "dir":
                raise FileConflict(f"'{path}' is a directory.")
            data = bytes(sandbox.files.read(real, format="bytes"))
        end = None if length is None else offset + length
        return data[offset:end]

    def write_file(self, provider_id: str, path: str, data: bytes) -> FileEntry:
        real = self._real(provider_id, path)
        sandbox = self._sandbox(provider_id)
        with self._translate(provider_id, files=True):
            sandbox.files.write(real, data)  # envd creates missing parent directories
            return self._entry(sandbox.files.get_info(real), self._paths.resolve(path))

    def mkdir(self, provider_id: str, path: str) -> FileEntry:
        real = self._real(provider_id, path)
        sandbox = self._sandbox(provider_id)
        with self._translate(provider_id, files=True):
            sandbox.files.make_dir(real)
            info = sandbox.files.get_info(real)
        entry = self._entry(info, self._paths.resolve(path))
        if entry.type != "dir":
            raise FileConflict(f"'{path}' exists and is not a directory.")
        return entry

    def list_files(self, provider_id: str, path: str, recursive: bool = False) -> list[FileEntry]:
        real = self._real(provider_id, path)
        lexical = self._paths.resolve(path)
        sandbox = self._sandbox(provider_id)
        with self._translate(provider_id, files=True):
            if _kind(sandbox.files.get_info(real)) != "dir":
                raise FileConflict(f"'{path}' is not a directory.")
            # depth=None lists the whole tree (envd's depth 0 means unlimited)
            infos = sandbox.files.list(real, depth=None if recursive else 1)
        entries = []
        for info in infos:
            shown = posixpath.join(lexical, posixpath.relpath(info.path, real))
            entries.append(self._entry(info, shown))
        return sorted(entries, key=lambda e: e.path)

    def stat(self, provider_id: str, path: str) -> FileEntry:
        real = self._real(provider_id, path, follow_last=False)
        with self._translate(provider_id, files=True):
            info = self._sandbox(provider_id).files.get_info(real)
        return self._entry(info, self._paths.resolve(path))

    def exists(self, provider_id: str, path: str) -> bool:
        real = self._real(provider_id, path, follow_last=False)
        with self._translate(provider_id, files=True):
            return bool(self._sandbox(provider_id).files.exists(real))

    def remove(self, provider_id: str, path: str, recursive: bool = False) -> None:
        """envd removes recursively, so a non-recursive call checks for children first."""
        real = self._real(provider_id, path, follow_last=False)
        if real == self._paths.root:
            raise PathNotAllowed("The workspace itself cannot be removed.")
        files = self._sandbox(provider_id).files
        with self._translate(provider_id, files=True):
            info = files.get_info(real)
            if not recursive and _kind(info) == "dir" and files.list(real, depth=1):
                raise FileConflict(f"'{path}' is a directory that is not empty.")
            files.remove(real)

    def move(self, provider_id: str, src: str, dst: str) -> FileEntry:
        real_src = self._real(provider_id, src, follow_last=False)
        real_dst = self._real(provider_id, dst, follow_last=False)
        files = self._sandbox(provider_id).files
        with self._translate(provider_id, files=True):
            files.get_info(real_src)  # FileNotFound before creating anything
            files.make_dir(posixpath.dirname(real_dst))
            info = files.rename(real_src, real_dst)
        return self._entry(info, self._paths.resolve(dst))

    # -- processes ----------------------------------------------------------------------------

    def start_process(
        self,
        provider_id: str,
        command: str,
        args: Sequence[str] | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ProcessInfo:
        line = command_line(ExecRequest(command=command, args=args))
        sandbox = self._sandbox(provider_id)
        with self._translate(provider_id):
            handle = sandbox.commands.run(
                line,
                background=True,
                envs=check_env(env or {}),
                cwd=self._paths.cwd(cwd),
                timeout=0,
                retain_output=False,
            )
            handle.disconnect()  # it keeps running; we stop receiving its output
        return ProcessInfo(pid=handle.pid, command=line, running=True, started_at=time.time())

    def list_processes(self, provider_id: str) -> list[ProcessInfo]:
        """envd lists the processes it started that are still running."""
        with self._translate(provider_id):
            processes = self._sandbox(provider_id).commands.list()
        out = []
        for p in processes:
            args = list(p.args or [])
            command = (
                args[2]
                if args[:2] == ["-l", "-c"] and len(args) > 2
                else shlex.join([p.cmd, *args])
            )
            out.append(ProcessInfo(pid=p.pid, command=command, running=True))
        return out

    def signal_process(self, provider_id: str, pid: int, signal: int) -> None:
        """SIGKILL through the SDK; other signals with `kill` inside the sandbox."""
        if not 1 <= signal <= 64:
            raise InvalidRequest(f"Invalid signal {signal}.")
        sandbox = self._sandbox(provider_id)
        with self._translate(provider_id):
            if pid not in {p.pid for p in sandbox.commands.list()}:
                raise ProcessNotFound(f"No process {pid} in this sandbox.")
            if signal == 9:
                sandbox.commands.kill(pid)
                return
        self._helper(provider_id, f"kill -s {int(signal)} {int(pid)}")

    # -- real-time --------------------------------------------------------------------------------

    def open_pty(
        self,
        provider_id: str,
        cols: int = 80,
        rows: int = 24,
        shell: str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> PtySession:
        """envd starts `bash -i -l`; another `shell` is exec'd from it as the first input."""
        sandbox = self._sandbox(provider_id)
        with self._translate(provider_id):
            handle = sandbox.pty.create(
                self._sdk.PtySize(rows=rows, cols=cols),
                cwd=self._paths.cwd(cwd),
                envs=check_env(env or {}),
                timeout=0,
            )
        session = E2BPtySession(self, sandbox, handle)
        if shell and posixpath.basename(shell) != "bash":
            session.write(f"exec {shlex.quote(shell)}\n".encode())
        return session

    def open_ports(self, provider_id: str) -> list[OpenPort]:
        """Listening TCP sockets from /proc/net/tcp and tcp6 inside the sandbox."""
        text = self._helper(provider_id, "cat /proc/net/tcp /proc/net/tcp6 2>/dev/null || true")
        ports: dict[int, OpenPort] = {}
        for line in text.splitlines()[1:]:
            fields = line.split()
            if len(fields) < 4 or fields[3] != _LISTEN or ":" not in fields[1]:
                continue
            address_hex, port_hex = fields[1].rsplit(":", 1)
            port = int(port_hex, 16)
            address = "0.0.0.0"
            if len(address_hex) == 8:
                address = socket.inet_ntoa(bytes.fromhex(address_hex)[::-1])
            elif set(address_hex) != {"0"}:
                address = "::"
            ports.setdefault(port, OpenPort(port=port, address=address))
        return sorted(ports.values(), key=lambda p: p.port)

    def connect_port(self, provider_id: str, port: int) -> PortStream:
        """TLS to E2B's public host for the port (plain TCP when the SDK gives host:port, as
        in debug mode). E2B's edge routes by the Host header, so an HTTP client on this
        stream must send that host."""
        if not 1 <= port <= 65535:
            raise InvalidRequest(f"Invalid port {port}.")
        with self._translate(provider_id):
            host = self._sandbox(provider_id).get_host(port)
            name, sep, explicit = host.rpartition(":")
            if sep and explicit.isdigit():
                sock = socket.create_connection((name, int(explicit)), timeout=10)
                sock.settimeout(None)
                return E2BPortStream(sock, tls=False, host_header=host)
            raw = socket.create_connection((host, 443), timeout=10)
            tls = ssl.create_default_context().wrap_socket(raw, server_hostname=host)
            tls.settimeout(None)
            return E2BPortStream(tls, tls=True, host_header=host)

    def watch(
        self, provider_id: str, path: str, recursive: bool = True
    ) -> Iterator[list[FileEvent]]:
        real = self._real(provider_id, path)
        with self._translate(provider_id, files=True):
            handle = self._sandbox(provider_id).files.watch_dir(real, recursive=recursive)
        return E2BWatch(self, handle, self._paths.resolve(path))
