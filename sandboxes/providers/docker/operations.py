"""DockerProvider's operations inside a running container, each one request to the
container's agent (sandboxes/agent/): the connection to it (a bind-mounted Unix socket, or
a relay over `docker exec`; see provider.py's module doc) and what goes over it: commands,
files, background processes, terminals, ports and watches.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any

from sandboxes.providers import agent_bundle
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
    FileTooLarge,
    InvalidRequest,
    OpenPort,
    PathNotAllowed,
    ProcessInfo,
    ProviderError,
    ProviderUnavailable,
    ResourceExhausted,
    SandboxGone,
)

from .container import AGENT_SOCKET, GVISOR, MAX_PATH_BYTES, WORKSPACE, AgentTarget
from .errors import translate
from .relay import ExecBridge
from .sessions import DockerWatch

CONTROL_TIMEOUT_S = 60.0
_AGENT_START_S = 15.0
"""How long the first call after create waits for the agent to listen."""
_AGENT_POLL_S = (0.002, 0.02)
"""While it does not: connect again after 2 ms, backing off to 20 ms (fifty sandboxes
starting at once otherwise spin the server's CPU on failed connects)."""
_AGENT_ENGINE_CHECK_S = 0.25
"""... and ask the Engine whether the container still runs this often."""
_STOP_SETTLE_S = 3.0
"""How long a broken agent connection waits for the container to be seen stopped."""
_TRANSPORT_GRACE_S = 15.0
"""How long past a command's own timeout we wait for the agent's reply."""


class DockerOperations:
    """The agent connection and the operations over it, for DockerProvider (which supplies
    the Engine client and the lookups)."""

    max_file_bytes: int

    def _api(self) -> Any:
        raise NotImplementedError  # DockerProvider's

    def _inspect(self, provider_id: str) -> dict[str, Any]:
        raise NotImplementedError  # DockerProvider's

    def _label(self, key: str) -> str:
        raise NotImplementedError  # DockerProvider's

    def _target(self, provider_id: str) -> AgentTarget:
        raise NotImplementedError  # DockerProvider's

    # -- the agent -------------------------------------------------------------

    def agent_socket(self, provider_id: str) -> socket.socket:
        """A new connection to the sandbox's agent, for its session ops (terminals and
        runs that outlive a web process: sandboxes/agent_sessions.py)."""
        return self._connect(provider_id, timeout=CONTROL_TIMEOUT_S)

    def _connect(self, provider_id: str, timeout: float) -> socket.socket:
        """A connection to the sandbox's agent (waiting for it to listen after create)."""
        target = self._target(provider_id)
        if target.agent != agent_bundle.image_path():
            # Made by another Sandpit version: its agent may speak another protocol.
            raise ProviderUnavailable(
                f"Sandbox {provider_id} was created by another version of Sandpit (its "
                f"agent is {target.agent or 'missing'}, this server's is "
                f"{agent_bundle.file_name()}); destroy it and create a new one."
            )
        if target.socket_dir is None:
            return self._relay(target, timeout)
        deadline = time.monotonic() + _AGENT_START_S
        pause, next_check = _AGENT_POLL_S[0], time.monotonic() + _AGENT_ENGINE_CHECK_S / 5
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            dir_fd = None
            try:
                path = str(target.socket_dir / "agent.sock")
                if len(path.encode()) > 100:  # sun_path holds 107 bytes: go through the dir
                    dir_fd = os.open(target.socket_dir, os.O_PATH | os.O_DIRECTORY)
                    path = f"/proc/self/fd/{dir_fd}/agent.sock"
                sock.connect(path)
                return sock
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                sock.close()
                ask_engine = time.monotonic() >= next_check
                self._check_agent_starting(target, deadline, exc, ask_engine)
                if ask_engine:
                    next_check = time.monotonic() + _AGENT_ENGINE_CHECK_S
                time.sleep(pause)
                pause = min(pause * 1.5, _AGENT_POLL_S[1])
            except OSError as exc:
                sock.close()
                raise self._lost(target, exc) from None
            finally:
                if dir_fd is not None:
                    os.close(dir_fd)

    def _check_agent_starting(
        self, target: AgentTarget, deadline: float, exc: Exception, ask_engine: bool
    ) -> None:
        """While the agent is not listening: a stopped container is gone (or never had
        this agent: an outdated image); past the deadline the agent is lost."""
        if target.socket_dir is not None and not target.socket_dir.is_dir():
            raise SandboxGone(f"Sandbox {target.cid} no longer exists.")
        if time.monotonic() >= deadline:
            raise self._lost(target, exc)
        if ask_engine:
            self._raise_if_stopped(target)

    def _raise_if_stopped(self, target: AgentTarget, during_call: bool = False) -> None:
        """Nothing while the container runs; else why it does not: an image without this
        agent (ProviderUnavailable with a rebuild hint), a gVisor sandbox that died
        `during_call` (ResourceExhausted), or SandboxGone."""
        info = self._inspect(target.cid)
        if info["State"].get("Running"):
            return
        with translate(target.cid):
            logs = self._api().logs(target.cid, stdout=True, stderr=True, tail=20)
        if b"can't open file" in logs and agent_bundle.IMAGE_DIR.encode() in logs:
            raise ProviderUnavailable(
                f"The sandbox image {info['Config'].get('Image')} has no "
                f"{agent_bundle.image_path()}: it was built from other Sandpit sources. "
                "Rebuild it with scripts/build-sandbox-image.sh."
            )
        labels = info["Config"].get("Labels") or {}
        if during_call and labels.get(self._label("isolation")) == GVISOR:
            # gVisor's kernel is one set of host processes: the host's OOM killer or pids
            # limit ends all of it, not the one process that overran.
            raise ResourceExhausted(
                f"Sandbox {target.cid} stopped: under gVisor, running out of memory or "
                "processes ends the whole sandbox."
            )
        if during_call:
            raise SandboxGone(f"Sandbox {target.cid} stopped while running the command.")
        raise SandboxGone(f"Sandbox {target.cid} is not running.")

    def _lost(self, target: AgentTarget, exc: Exception) -> ProviderError:
        """The error for a connection to the agent that broke mid-call. The agent's end
        often comes first and the container's a moment later (its init then exits; under
        gVisor, the host kills the whole sandbox), so the engine is asked for a while."""
        deadline = time.monotonic() + _STOP_SETTLE_S
        while True:
            try:
                self._raise_if_stopped(target, during_call=True)
            except ProviderError as gone:
                return gone
            if time.monotonic() >= deadline:
                return ProviderError(f"Lost the sandbox agent: {exc!r}")
            time.sleep(0.05)

    def _relay(self, target: AgentTarget, timeout: float) -> socket.socket:
        api = self._api()
        argv = ["/usr/bin/python3", "-I", "-S", agent_bundle.image_path(), "--relay", AGENT_SOCKET]
        try:
            with translate(target.cid):
                exec_id = api.exec_create(
                    target.cid, argv, stdin=True, environment=["SANDPIT_INTERNAL=1"]
                )["Id"]
                stream = api.exec_start(exec_id, socket=True)
        except SandboxGone:
            self._raise_if_stopped(target)  # says why (an image without this agent?)
            raise
        sock = ExecBridge(stream).sock
        sock.settimeout(timeout)
        return sock

    def _call(
        self, provider_id: str, request: dict[str, Any], timeout: float = CONTROL_TIMEOUT_S
    ) -> dict[str, Any]:
        sock = self._connect(provider_id, timeout)
        try:
            sock.sendall(json.dumps(request).encode() + b"\n")
            return wire.reply(sock)
        except (OSError, ValueError, KeyError) as exc:
            raise self._lost(self._target(provider_id), exc) from None
        finally:
            sock.close()

    # -- execution -------------------------------------------------------------

    def exec(self, provider_id: str, request: ExecRequest) -> ExecResult:
        """Run one command to completion; a timeout kills its whole tree (exit -9)."""
        if request.args is None:
            argv = ["/bin/sh", "-c", request.command]
        else:
            argv = [request.command, *request.args]
        return self._exec(provider_id, argv, request)

    def _exec(self, provider_id: str, argv: list[str], request: ExecRequest) -> ExecResult:
        if request.timeout_s <= 0:
            raise InvalidRequest("timeout_s must be positive.")
        if request.max_output_bytes < 0:
            raise InvalidRequest("max_output_bytes must not be negative.")
        if request.cwd is not None:
            _check_path(request.cwd)
        if any("\x00" in a for a in argv):
            raise InvalidRequest("Command arguments cannot contain NUL bytes.")
        env = dict(request.env)
        check_env(env)
        stdin = request.stdin or b""
        header = {
            "op": "exec",
            "argv": argv,
            "cwd": _cwd(request.cwd),
            "env": env,
            "timeout_s": request.timeout_s,
            "max_output_bytes": request.max_output_bytes,
            "stdin_len": len(stdin),
        }
        sock = self._connect(provider_id, timeout=request.timeout_s + _TRANSPORT_GRACE_S)
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
            raise self._lost(self._target(provider_id), exc) from None
        finally:
            sock.close()
        return ExecResult(
            stdout=body[:out_len],
            stderr=body[out_len:],
            exit_code=int(reply["exit_code"]),
            duration_ms=float(reply["duration_ms"]),
            timed_out=bool(reply["timed_out"]),
            stdout_truncated=bool(reply["stdout_truncated"]),
            stderr_truncated=bool(reply["stderr_truncated"]),
            cpu_time_ms=_opt_float(reply.get("cpu_time_ms")),
            peak_memory_bytes=_opt_int(reply.get("peak_memory_bytes")),
            oom_killed=bool(reply.get("oom_killed")),
        )

    def exec_stream(self, provider_id: str, request: ExecRequest) -> AgentExecStream:
        """Start a command and stream its output (see base.ExecStream)."""
        argv = (
            ["/bin/sh", "-c", request.command]
            if request.args is None
            else [request.command, *request.args]
        )
        if any("\x00" in a for a in argv):
            raise InvalidRequest("Command arguments cannot contain NUL bytes.")
        if request.timeout_s <= 0:
            raise InvalidRequest("timeout_s must be positive.")
        if request.cwd is not None:
            _check_path(request.cwd)
        env = dict(request.env)
        check_env(env)
        sock = self._connect(provider_id, timeout=CONTROL_TIMEOUT_S)
        try:
            sock.sendall(wire.exec_stream_request(argv, _cwd(request.cwd), env, request.timeout_s))
            stream = AgentExecStream(sock, int(wire.reply(sock)["pid"]))
        except BaseException as exc:
            sock.close()
            if isinstance(exc, (OSError, ValueError, KeyError)):
                raise self._lost(self._target(provider_id), exc) from None
            raise
        if request.stdin:
            stream.write_stdin(request.stdin)
        return stream

    # -- files -------------------------------------------------------------------

    def read_file(
        self, provider_id: str, path: str, offset: int = 0, length: int | None = None
    ) -> bytes:
        _check_path(path)
        if offset < 0 or (length is not None and length < 0):
            raise InvalidRequest("offset and length must not be negative.")
        request = {
            "op": "read",
            "path": path,
            "offset": offset,
            "length": length,
            "max": self.max_file_bytes,
        }
        sock = self._connect(provider_id, CONTROL_TIMEOUT_S)
        try:
            sock.sendall(json.dumps(request).encode() + b"\n")
            size = int(wire.reply(sock)["size"])
            if not 0 <= size <= self.max_file_bytes:
                raise ProviderError("the sandbox agent sent an oversized reply")
            return wire.recv_exact(sock, size)
        except (OSError, ValueError, KeyError) as exc:
            raise self._lost(self._target(provider_id), exc) from None
        finally:
            sock.close()

    def write_file(self, provider_id: str, path: str, data: bytes) -> FileEntry:
        """Creates parent directories; FileTooLarge beyond `max_file_bytes`."""
        _check_path(path)
        if len(data) > self.max_file_bytes:
            raise FileTooLarge(f"{len(data)} bytes is over the {self.max_file_bytes}-byte limit.")
        sock = self._connect(provider_id, CONTROL_TIMEOUT_S)
        try:
            header = {"op": "write", "path": path, "size": len(data)}
            sock.sendall(json.dumps(header).encode() + b"\n")
            sock.sendall(data)
            return _entry(wire.reply(sock)["entry"])
        except (OSError, ValueError, KeyError) as exc:
            raise self._lost(self._target(provider_id), exc) from None
        finally:
            sock.close()

    def mkdir(self, provider_id: str, path: str) -> FileEntry:
        _check_path(path)
        return _entry(self._call(provider_id, {"op": "mkdir", "path": path})["entry"])

    def list_files(self, provider_id: str, path: str, recursive: bool = False) -> list[FileEntry]:
        _check_path(path)
        reply = self._call(provider_id, {"op": "list_files", "path": path, "recursive": recursive})
        return [_entry(row) for row in reply["entries"]]

    def stat(self, provider_id: str, path: str) -> FileEntry:
        _check_path(path)
        return _entry(self._call(provider_id, {"op": "stat", "path": path})["entry"])

    def exists(self, provider_id: str, path: str) -> bool:
        _check_path(path)
        return bool(self._call(provider_id, {"op": "exists", "path": path})["exists"])

    def remove(self, provider_id: str, path: str, recursive: bool = False) -> None:
        _check_path(path)
        self._call(provider_id, {"op": "remove", "path": path, "recursive": recursive})

    def move(self, provider_id: str, src: str, dst: str) -> FileEntry:
        _check_path(src)
        _check_path(dst)
        return _entry(self._call(provider_id, {"op": "move", "src": src, "dst": dst})["entry"])

    # -- processes -----------------------------------------------------------------

    def start_process(
        self,
        provider_id: str,
        command: str,
        args: Sequence[str] | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ProcessInfo:
        """Start in the background in its own session; the pid is the one inside the sandbox."""
        if cwd is not None:
            _check_path(cwd)
        env_d = dict(env or {})
        check_env(env_d)
        argv = ["/bin/sh", "-c", command] if args is None else [command, *args]
        shown = command if args is None else " ".join([command, *args])
        reply = self._call(
            provider_id,
            {"op": "start", "argv": argv, "command": shown, "cwd": _cwd(cwd), "env": env_d},
        )
        return _process(reply["process"])

    def list_processes(self, provider_id: str) -> list[ProcessInfo]:
        """Live processes (excluding init and Sandpit's own helpers) and exited background ones."""
        reply = self._call(provider_id, {"op": "list", "all": True})
        return [_process(row) for row in reply["processes"]]

    def signal_process(self, provider_id: str, pid: int, signal: int) -> None:
        """Signal a process (its whole group when it is one we started)."""
        self._call(provider_id, {"op": "signal", "pid": int(pid), "signal": int(signal)})

    # -- real-time ---------------------------------------------------------------------

    def open_pty(
        self,
        provider_id: str,
        cols: int = 80,
        rows: int = 24,
        shell: str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> AgentPtySession | AgentRelayPtySession:
        """A terminal running `shell` (bash by default) in the workspace. With a local
        engine the agent passes the PTY master to us; over a relay it relays the bytes."""
        if cwd is not None:
            _check_path(cwd)
        env_d = {"TERM": "xterm-256color", **dict(env or {})}
        check_env(env_d)
        target = self._target(provider_id)
        sock = self._connect(provider_id, timeout=CONTROL_TIMEOUT_S)
        master = None
        try:
            request = {
                "op": "pty",
                "argv": [shell or "/bin/bash"],
                "cols": int(cols),
                "rows": int(rows),
                "cwd": _cwd(cwd),
                "env": env_d,
                "pass_fd": target.socket_dir is not None,
            }
            sock.sendall(json.dumps(request).encode() + b"\n")
            reply, master = wire.pty_reply(sock)
            pid = int(reply["pid"])
            if reply.get("mode") == "fd":
                if master is None:
                    raise ProviderError("the sandbox agent did not pass the terminal")
                sock.settimeout(None)
                return AgentPtySession(master, sock, pid)
            if master is not None:
                os.close(master)
                master = None
            sock.setblocking(False)
            return AgentRelayPtySession(lambda req: self._call(provider_id, req), sock, pid)
        except BaseException as exc:
            sock.close()
            if master is not None:
                os.close(master)
            if isinstance(exc, (OSError, ValueError, KeyError)):
                raise self._lost(target, exc) from None
            raise

    def open_ports(self, provider_id: str) -> list[OpenPort]:
        reply = self._call(provider_id, {"op": "ports"})
        return [OpenPort(port=int(p["port"]), address=str(p["address"])) for p in reply["ports"]]

    def connect_port(self, provider_id: str, port: int) -> AgentPortStream:
        """Bytes to 127.0.0.1:port, spliced by the agent (works with network none).

        Raises InvalidRequest when nothing listens there.
        """
        if not 0 < int(port) < 65536:
            raise InvalidRequest(f"Invalid port {port!r}.")
        sock = self._connect(provider_id, timeout=CONTROL_TIMEOUT_S)
        try:
            sock.sendall(json.dumps({"op": "connect", "port": int(port)}).encode() + b"\n")
            wire.reply(sock)
        except ProviderError as exc:
            sock.close()
            if "listens" in exc.message:
                raise InvalidRequest(
                    f"Nothing is listening on port {port} in the sandbox."
                ) from None
            raise
        except BaseException:
            sock.close()
            raise
        sock.settimeout(None)
        return AgentPortStream(sock)

    def watch(self, provider_id: str, path: str, recursive: bool = True) -> DockerWatch:
        """Batches of file events under `path`; the watch is armed when this returns."""
        _check_path(path)
        sock = self._connect(provider_id, timeout=CONTROL_TIMEOUT_S)
        try:
            request = {"op": "watch", "path": path, "recursive": recursive}
            sock.sendall(json.dumps(request).encode() + b"\n")
            wire.reply(sock)
        except BaseException:
            sock.close()
            raise
        sock.settimeout(None)
        return DockerWatch(sock)


def _check_path(path: str) -> None:
    if not isinstance(path, str) or "\x00" in path or len(path.encode()) > MAX_PATH_BYTES:
        raise PathNotAllowed("The path is malformed (NUL byte or longer than 4096 bytes).")


def check_env(env: Mapping[str, str]) -> list[str]:
    out = []
    for key, value in env.items():
        if not key or "=" in key or "\x00" in key or "\x00" in value:
            raise InvalidRequest(f"Invalid environment variable name or value: {key!r}")
        out.append(f"{key}={value}")
    return out


def _cwd(cwd: str | None) -> str:
    if not cwd:
        return WORKSPACE
    return cwd if cwd.startswith("/") else f"{WORKSPACE}/{cwd}"


def _entry(data: Mapping[str, Any]) -> FileEntry:
    return FileEntry(
        name=data["name"],
        path=data["path"],
        type=data["type"],
        size=int(data["size"]),
        mtime=float(data["mtime"]),
    )


def _process(data: Mapping[str, Any]) -> ProcessInfo:
    return ProcessInfo(
        pid=int(data["pid"]),
        command=data["command"],
        running=bool(data["running"]),
        exit_code=data.get("exit_code"),
        started_at=data.get("started_at"),
    )


def _opt_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _opt_float(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
