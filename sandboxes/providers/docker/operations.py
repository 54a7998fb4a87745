"""DockerProvider's operations inside a running container, each one request to the
container's agent (sandboxes/agent/): the connection to it (a bind-mounted Unix socket, or
a relay over `docker exec`; see provider.py's module doc) and what goes over it: commands,
files, background processes, terminals, ports and watches.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Mapping
from typing import Any

from sandboxes.providers import agent_bundle
from sandboxes.providers import agent_client as wire
from sandboxes.providers.agent_operations import AgentOperations
from sandboxes.providers.base import (
    FileEntry,
    FileTooLarge,
    InvalidRequest,
    PathNotAllowed,
    ProviderError,
    ProviderUnavailable,
    ResourceExhausted,
    SandboxGone,
)
from sandboxes.providers.unix_sockets import reachable_path

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


class DockerOperations(AgentOperations):
    """The agent connection and the operations over it, for DockerProvider (which supplies
    the Engine client and the lookups)."""

    max_file_bytes: int
    control_timeout_s = CONTROL_TIMEOUT_S

    def _api(self) -> Any:
        raise NotImplementedError  # DockerProvider's

    def _inspect(self, provider_id: str) -> dict[str, Any]:
        raise NotImplementedError  # DockerProvider's

    def _label(self, key: str) -> str:
        raise NotImplementedError  # DockerProvider's

    def _target(self, provider_id: str) -> AgentTarget:
        raise NotImplementedError  # DockerProvider's

    # -- the agent -------------------------------------------------------------

    def _agent_cwd(self, cwd: str | None) -> str:
        if cwd is not None:
            _check_path(cwd)
        return _cwd(cwd)

    def _passes_fd(self, provider_id: str) -> bool:
        return self._target(provider_id).socket_dir is not None

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
            try:
                with reachable_path(target.socket_dir / "agent.sock") as path:
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
                raise self._lost_target(target, exc) from None

    def _check_agent_starting(
        self, target: AgentTarget, deadline: float, exc: Exception, ask_engine: bool
    ) -> None:
        """While the agent is not listening: a stopped container is gone (or never had
        this agent: an outdated image); past the deadline the agent is lost."""
        if target.socket_dir is not None and not target.socket_dir.is_dir():
            raise SandboxGone(f"Sandbox {target.cid} no longer exists.")
        if time.monotonic() >= deadline:
            raise self._lost_target(target, exc)
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

    def _lost(self, provider_id: str, exc: Exception) -> ProviderError:
        return self._lost_target(self._target(provider_id), exc)

    def _lost_target(self, target: AgentTarget, exc: Exception) -> ProviderError:
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
            raise self._lost(provider_id, exc) from None
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
            if data:  # an empty send could come after the agent answered and closed: EPIPE
                sock.sendall(data)
            return _entry(wire.reply(sock)["entry"])
        except (OSError, ValueError, KeyError) as exc:
            raise self._lost(provider_id, exc) from None
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
