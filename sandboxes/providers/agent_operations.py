"""The operations that are one request to a sandbox's agent (sandboxes/agent/), the same for
every provider that runs it: commands (exec, exec_stream), background processes, terminals
and port streams. A provider supplies how to reach its agent and how to explain a lost
connection; the wire format is agent_client.py's.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any

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
    InvalidRequest,
    OpenPort,
    ProcessInfo,
    ProviderError,
)

CONTROL_TIMEOUT_S = 10.0
TRANSPORT_GRACE_S = 15.0
"""How long past a command's own timeout we wait for the agent's reply."""


class AgentOperations:
    """Mixed into a provider that supplies `_connect`, `_lost` and `_agent_cwd`."""

    control_timeout_s = CONTROL_TIMEOUT_S
    lists_every_process = True
    """list_processes: every live process the sandbox's user can see, or only started ones."""

    def _connect(self, provider_id: str, timeout: float) -> socket.socket:
        raise NotImplementedError  # the provider's: a connection to the sandbox's agent

    def _lost(self, provider_id: str, exc: Exception) -> ProviderError:
        raise NotImplementedError  # the provider's: why a connection to the agent broke

    def _agent_cwd(self, cwd: str | None) -> str:
        raise NotImplementedError  # the provider's: a cwd as the agent sees it

    def _passes_fd(self, provider_id: str) -> bool:
        """Whether the agent can hand us a PTY master (not through a relay)."""
        return True

    def _oom_mark(self, provider_id: str) -> int | None:
        """Something read before a command that `_oom_killed` compares after it; None when
        the agent's own reply says whether the kernel's OOM killer ended it."""
        return None

    def _oom_killed(
        self, provider_id: str, exit_code: int, reply: Mapping[str, Any], mark: int | None
    ) -> bool:
        return bool(reply.get("oom_killed"))

    # -- the agent ---------------------------------------------------------------------

    def agent_socket(self, provider_id: str) -> socket.socket:
        """A new connection to the sandbox's agent, for its session ops (terminals and
        runs that outlive a web process: sandboxes/agent_sessions.py)."""
        return self._connect(provider_id, timeout=self.control_timeout_s)

    def _call(
        self, provider_id: str, request: dict[str, Any], timeout: float | None = None
    ) -> dict[str, Any]:
        sock = self._connect(provider_id, timeout or self.control_timeout_s)
        try:
            sock.sendall(json.dumps(request).encode() + b"\n")
            return wire.reply(sock)
        except (OSError, ValueError, KeyError) as exc:
            raise self._lost(provider_id, exc) from None
        finally:
            sock.close()

    # -- execution -----------------------------------------------------------------------

    def exec(self, provider_id: str, request: ExecRequest) -> ExecResult:
        """Run one command to completion; a timeout kills its whole tree (exit -9)."""
        return self._exec(provider_id, command_argv(request.command, request.args), request)

    def _exec(self, provider_id: str, argv: list[str], request: ExecRequest) -> ExecResult:
        if request.max_output_bytes < 0:
            raise InvalidRequest("max_output_bytes must not be negative.")
        env = checked_command(argv, request)
        stdin = request.stdin or b""
        header = {
            "op": "exec",
            "argv": argv,
            "cwd": self._agent_cwd(request.cwd),
            "env": env,
            "timeout_s": request.timeout_s,
            "max_output_bytes": request.max_output_bytes,
            "stdin_len": len(stdin),
        }
        mark = self._oom_mark(provider_id)
        sock = self._connect(provider_id, timeout=request.timeout_s + TRANSPORT_GRACE_S)
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
            oom_killed=self._oom_killed(provider_id, exit_code, reply, mark),
        )

    def exec_stream(self, provider_id: str, request: ExecRequest) -> AgentExecStream:
        """Start a command and stream its output (see base.ExecStream)."""
        argv = command_argv(request.command, request.args)
        env = checked_command(argv, request)
        sock = self._connect(provider_id, timeout=self.control_timeout_s)
        try:
            sock.sendall(
                wire.exec_stream_request(argv, self._agent_cwd(request.cwd), env, request.timeout_s)
            )
            stream = AgentExecStream(sock, int(wire.reply(sock)["pid"]))
        except BaseException as exc:
            sock.close()
            if isinstance(exc, (OSError, ValueError, KeyError)):
                raise self._lost(provider_id, exc) from None
            raise
        if request.stdin:
            stream.write_stdin(request.stdin)
        return stream

    # -- processes -----------------------------------------------------------------------

    def start_process(
        self,
        provider_id: str,
        command: str,
        args: Sequence[str] | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ProcessInfo:
        """Start in the background in its own session (output discarded); `args is None`
        runs `sh -c command`; the pid is the one inside the sandbox."""
        argv = command_argv(command, args)
        if any("\x00" in a for a in argv):
            raise InvalidRequest("Command arguments cannot contain NUL bytes.")
        env_d = {str(k): str(v) for k, v in (env or {}).items()}
        check_env(env_d)
        shown = command if args is None else " ".join([command, *args])
        reply = self._call(
            provider_id,
            {
                "op": "start",
                "argv": argv,
                "command": shown,
                "cwd": self._agent_cwd(cwd),
                "env": env_d,
            },
        )
        return _process(reply["process"])

    def list_processes(self, provider_id: str) -> list[ProcessInfo]:
        """Started processes, recently exited ones with their exit code, and (see
        lists_every_process) every other live one but the agent's own."""
        reply = self._call(provider_id, {"op": "list", "all": self.lists_every_process})
        return [_process(row) for row in reply["processes"]]

    def signal_process(self, provider_id: str, pid: int, signal: int) -> None:
        """Signal a process (its whole group when it is one we started)."""
        self._call(provider_id, {"op": "signal", "pid": int(pid), "signal": int(signal)})

    # -- real-time -------------------------------------------------------------------------

    def open_pty(
        self,
        provider_id: str,
        cols: int = 80,
        rows: int = 24,
        shell: str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> AgentPtySession | AgentRelayPtySession:
        """A terminal running `shell` (bash by default) in the workspace. The agent creates
        the PTY and the shell in the sandbox and passes the PTY master to us, so keystrokes
        and output skip the agent; fileno() is that master (non-blocking). Where the
        descriptor cannot be passed (a relay), the agent relays the bytes instead."""
        env_d = {"TERM": "xterm-256color", **{str(k): str(v) for k, v in (env or {}).items()}}
        check_env(env_d)
        request = {
            "op": "pty",
            "argv": [shell or "/bin/bash"],
            "cols": int(cols),
            "rows": int(rows),
            "cwd": self._agent_cwd(cwd),
            "env": env_d,
            "pass_fd": self._passes_fd(provider_id),
        }
        sock = self._connect(provider_id, timeout=self.control_timeout_s)
        master = None
        try:
            sock.sendall(json.dumps(request).encode() + b"\n")
            reply, master = wire.pty_reply(sock)
            pid = int(reply["pid"])
            if reply.get("mode") == "fd":
                if master is None:
                    raise ProviderError("the sandbox agent did not pass the terminal")
                sock.settimeout(None)
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
        """TCP ports listening inside the sandbox's network namespace."""
        reply = self._call(provider_id, {"op": "ports"})
        return [OpenPort(port=int(p["port"]), address=str(p["address"])) for p in reply["ports"]]

    def connect_port(self, provider_id: str, port: int) -> AgentPortStream:
        """Bytes to 127.0.0.1:port inside the sandbox, spliced by the agent (works without
        a network). InvalidRequest when nothing listens there."""
        if not 0 < int(port) < 65536:
            raise InvalidRequest(f"Invalid port {port!r}.")
        sock = self._connect(provider_id, timeout=self.control_timeout_s)
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


def command_argv(command: str, args: Sequence[str] | None) -> list[str]:
    """`sh -c command` when args is None, else the command and its arguments."""
    return ["/bin/sh", "-c", command] if args is None else [command, *args]


def checked_command(argv: Sequence[str], request: ExecRequest) -> dict[str, str]:
    """The request's environment, once argv, timeout and environment are well-formed."""
    if any("\x00" in a for a in argv):
        raise InvalidRequest("Command arguments cannot contain NUL bytes.")
    if request.timeout_s <= 0:
        raise InvalidRequest("timeout_s must be positive.")
    env = {str(k): str(v) for k, v in request.env.items()}
    check_env(env)
    return env


def check_env(env: Mapping[str, str]) -> list[str]:
    """`KEY=value` strings, once every name and value is one a process can receive."""
    out = []
    for key, value in env.items():
        if not key or "=" in key or "\x00" in key or "\x00" in value:
            raise InvalidRequest(f"Invalid environment variable name or value: {key!r}")
        out.append(f"{key}={value}")
    return out


def _process(data: Mapping[str, Any]) -> ProcessInfo:
    return ProcessInfo(
        pid=int(data["pid"]),
        command=str(data["command"]),
        running=bool(data["running"]),
        exit_code=_opt_int(data.get("exit_code")),
        started_at=_opt_float(data.get("started_at")),
    )


def _opt_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _opt_float(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
