"""What LocalProvider does inside a running jail: commands (exec, exec_stream), background
processes, terminals and port streams through the jail's agent (sandboxes/agent/, over a
Unix socket), and the file operations and watches that run host-side on the workspace
(files.py, watch.py).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from sandboxes.providers import agent_client as wire
from sandboxes.providers.agent_client import (
    AgentExecStream,
    AgentPortStream,
    AgentPtySession,
    AgentRelayPtySession,
)
from sandboxes.providers.base import (
    ExecRequest,
    ExecResult,
    FileEntry,
    FileEvent,
    InvalidRequest,
    OpenPort,
    ProcessInfo,
    ProviderError,
    SandboxGone,
)
from sandboxes.providers.local import jail
from sandboxes.providers.local.files import JAIL_WORKSPACE, Workspace
from sandboxes.providers.local.watch import WorkspaceWatch

CONTROL_TIMEOUT_S = 10.0


class JailOperations:
    """Operations on a running jail, for LocalProvider (which supplies the lookups)."""

    root_dir: Path

    def _dir(self, provider_id: str) -> Path:
        raise NotImplementedError  # LocalProvider's

    def _state(self, provider_id: str) -> tuple[Path, jail.JailState]:
        raise NotImplementedError  # LocalProvider's

    def _workspace(self, provider_id: str) -> Workspace:
        raise NotImplementedError  # LocalProvider's

    # -------------------------------------------------------------- execution

    def exec(self, provider_id: str, request: ExecRequest) -> ExecResult:
        """Run one command to completion; a timeout kills its whole tree (exit -9)."""
        if request.args is None:
            argv = ["/bin/sh", "-c", request.command]
        else:
            argv = [request.command, *request.args]
        return self._exec(provider_id, argv, request)

    def _exec(self, provider_id: str, argv: list[str], request: ExecRequest) -> ExecResult:
        if any("\x00" in a for a in argv):
            raise InvalidRequest("command contains a NUL byte")
        env = {str(k): str(v) for k, v in request.env.items()}
        check_env(env)
        if request.timeout_s <= 0 or request.max_output_bytes < 0:
            raise InvalidRequest("timeout_s must be positive, max_output_bytes not negative")
        stdin = request.stdin or b""
        header = {
            "op": "exec",
            "argv": argv,
            "cwd": _jail_cwd(request.cwd),
            "env": env,
            "timeout_s": request.timeout_s,
            "max_output_bytes": request.max_output_bytes,
            "stdin_len": len(stdin),
        }
        _, state = self._state(provider_id)
        oom_before = _oom_kills(state)
        sock = self._connect(provider_id, timeout=request.timeout_s + 15)
        try:
            sock.sendall(json.dumps(header).encode() + b"\n" + stdin)
            reply = wire.reply(sock)
            out_len, err_len = int(reply["stdout_len"]), int(reply["stderr_len"])
            if not (
                0 <= out_len <= request.max_output_bytes
                and 0 <= err_len <= request.max_output_bytes
            ):
                raise ProviderError("the sandbox agent sent an oversized reply")
            body = wire.recv_exact(sock, out_len + err_len)
        except (OSError, ValueError, KeyError) as exc:
            raise self._lost(provider_id, exc) from None
        finally:
            sock.close()
        exit_code = int(reply["exit_code"])
        oom = exit_code == -9 and not reply["timed_out"] and _oom_kills(state) > oom_before
        return ExecResult(
            stdout=body[:out_len],
            stderr=body[out_len:],
            exit_code=exit_code,
            duration_ms=float(reply["duration_ms"]),
            timed_out=bool(reply["timed_out"]),
            stdout_truncated=bool(reply["stdout_truncated"]),
            stderr_truncated=bool(reply["stderr_truncated"]),
            cpu_time_ms=_opt_float(reply.get("cpu_time_ms")),
            peak_memory_bytes=_opt_int(reply.get("peak_memory_bytes")),
            oom_killed=oom,
        )

    def exec_stream(self, provider_id: str, request: ExecRequest) -> AgentExecStream:
        """Start a command and stream its output (see base.ExecStream)."""
        argv = (
            ["/bin/sh", "-c", request.command]
            if request.args is None
            else [request.command, *request.args]
        )
        if any("\x00" in a for a in argv):
            raise InvalidRequest("command contains a NUL byte")
        env = {str(k): str(v) for k, v in request.env.items()}
        check_env(env)
        if request.timeout_s <= 0:
            raise InvalidRequest("timeout_s must be positive")
        sock = self._connect(provider_id, timeout=CONTROL_TIMEOUT_S)
        try:
            sock.sendall(
                wire.exec_stream_request(argv, _jail_cwd(request.cwd), env, request.timeout_s)
            )
            reply = wire.reply(sock)
            stream = AgentExecStream(sock, int(reply["pid"]))
        except BaseException as exc:
            sock.close()
            if isinstance(exc, (OSError, ValueError, KeyError)):
                raise self._lost(provider_id, exc) from None
            raise
        if request.stdin:
            stream.write_stdin(request.stdin)
        return stream

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

    # -------------------------------------------------------------- processes

    def start_process(
        self,
        provider_id: str,
        command: str,
        args: Sequence[str] | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ProcessInfo:
        """Start a background process (output discarded); `args is None` runs `sh -c command`."""
        argv = ["/bin/sh", "-c", command] if args is None else [command, *args]
        if any("\x00" in a for a in argv):
            raise InvalidRequest("command contains a NUL byte")
        env_d = {str(k): str(v) for k, v in (env or {}).items()}
        check_env(env_d)
        reply = self._call(
            provider_id,
            {
                "op": "start",
                "argv": argv,
                "command": " ".join([command, *(args or [])]),
                "cwd": _jail_cwd(cwd),
                "env": env_d,
            },
        )
        return _process(reply["process"])

    def list_processes(self, provider_id: str) -> list[ProcessInfo]:
        """Processes started with start_process (recently exited ones with their exit code)."""
        reply = self._call(provider_id, {"op": "list"})
        return [_process(p) for p in reply["processes"]]

    def signal_process(self, provider_id: str, pid: int, signal: int) -> None:
        """Signal the process group of a started process (or any pid inside the jail)."""
        self._call(provider_id, {"op": "signal", "pid": int(pid), "signal": int(signal)})

    # --------------------------------------------------------------- realtime

    def open_pty(
        self,
        provider_id: str,
        cols: int = 80,
        rows: int = 24,
        shell: str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> AgentPtySession | AgentRelayPtySession:
        """A terminal inside the jail. The agent creates the PTY and the shell in the jail
        and passes the PTY master to us, so keystrokes and output skip the agent;
        fileno() is that master (non-blocking). If the descriptor cannot be passed the
        agent relays the bytes over its connection instead, as before."""
        env_d = {str(k): str(v) for k, v in (env or {}).items()}
        check_env(env_d)
        argv = [shell or "/bin/bash"]
        sock = self._connect(provider_id, timeout=CONTROL_TIMEOUT_S)
        master = None
        try:
            sock.sendall(
                json.dumps(
                    {
                        "op": "pty",
                        "argv": argv,
                        "cols": int(cols),
                        "rows": int(rows),
                        "cwd": _jail_cwd(cwd),
                        "env": env_d,
                        "pass_fd": True,
                    }
                ).encode()
                + b"\n"
            )
            reply, master = wire.pty_reply(sock)
            pid = int(reply["pid"])
            if reply.get("mode") == "fd":
                if master is None:
                    raise ProviderError("the sandbox agent did not pass the terminal")
                return AgentPtySession(master, sock, pid)
            if master is not None:  # a relay needs no descriptor
                os.close(master)
                master = None
            sock.setblocking(False)
            return AgentRelayPtySession(lambda req: self._call(provider_id, req), sock, pid)
        except BaseException as exc:
            sock.close()
            if master is not None:
                os.close(master)
            if isinstance(exc, (OSError, ValueError, KeyError)):
                raise self._lost(provider_id, exc) from None
            raise

    def open_ports(self, provider_id: str) -> list[OpenPort]:
        """TCP ports listening inside the jail's network namespace (/proc/net/tcp{,6})."""
        reply = self._call(provider_id, {"op": "ports"})
        return [OpenPort(port=int(p["port"]), address=str(p["address"])) for p in reply["ports"]]

    def connect_port(self, provider_id: str, port: int) -> AgentPortStream:
        """A byte stream to 127.0.0.1:port inside the jail, spliced by the agent."""
        sock = self._connect(provider_id, timeout=CONTROL_TIMEOUT_S)
        try:
            sock.sendall(json.dumps({"op": "connect", "port": int(port)}).encode() + b"\n")
            wire.reply(sock)
        except BaseException:
            sock.close()
            raise
        sock.settimeout(None)
        return AgentPortStream(sock)

    def watch(
        self, provider_id: str, path: str, recursive: bool = True
    ) -> Iterator[list[FileEvent]]:
        """Host-side inotify; watches are in place when this returns. Close with .close()."""
        return WorkspaceWatch(self._workspace(provider_id), path, recursive)

    # ------------------------------------------------------------ agent calls

    def agent_socket(self, provider_id: str) -> socket.socket:
        """A new connection to the sandbox's agent, for its session ops (terminals and
        runs that outlive a web process: sandboxes/agent_sessions.py)."""
        return self._connect(provider_id, timeout=CONTROL_TIMEOUT_S)

    def _connect(self, provider_id: str, timeout: float) -> socket.socket:
        run_dir = self._dir(provider_id) / "run"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        dir_fd = None
        try:
            target = str(run_dir / "agent.sock")
            if len(target.encode()) > 100:
                # Unix socket paths are limited to 107 bytes; reach a deep root through a
                # descriptor of its directory instead.
                dir_fd = os.open(run_dir, os.O_PATH | os.O_DIRECTORY)
                target = f"/proc/self/fd/{dir_fd}/agent.sock"
            _connect_patiently(sock, target, timeout)
        except OSError:
            sock.close()
            if not (self.root_dir / provider_id).exists():
                raise SandboxGone(f"no sandbox {provider_id!r}") from None
            raise SandboxGone(f"sandbox {provider_id} is stopped") from None
        finally:
            if dir_fd is not None:
                os.close(dir_fd)
        return sock

    def _call(self, provider_id: str, request: dict, timeout: float = CONTROL_TIMEOUT_S) -> dict:
        sock = self._connect(provider_id, timeout)
        try:
            sock.sendall(json.dumps(request).encode() + b"\n")
            return wire.reply(sock)
        except (OSError, ValueError, KeyError) as exc:
            raise self._lost(provider_id, exc) from None
        finally:
            sock.close()

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


def check_env(env: Mapping[str, str]) -> None:
    for key, value in env.items():
        if not key or "=" in key or "\x00" in key or "\x00" in value:
            raise InvalidRequest(f"invalid environment variable {key!r}")


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


def _jail_cwd(cwd: str | None) -> str:
    if not cwd:
        return JAIL_WORKSPACE
    if "\x00" in cwd:
        raise InvalidRequest("cwd contains a NUL byte")
    return cwd if cwd.startswith("/") else f"{JAIL_WORKSPACE}/{cwd}"


def _process(data: dict) -> ProcessInfo:
    return ProcessInfo(
        pid=int(data["pid"]),
        command=str(data["command"]),
        running=bool(data["running"]),
        exit_code=_opt_int(data.get("exit_code")),
        started_at=_opt_float(data.get("started_at")),
    )


def _opt_int(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[call-overload]


def _opt_float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def _oom_kills(state: jail.JailState) -> int:
    path = state.cgroups.get("memory")
    text = jail.read_text(f"{path}/memory.oom_control") if path else None
    for line in (text or "").splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return 0
