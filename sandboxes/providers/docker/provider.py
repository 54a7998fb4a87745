"""DockerProvider: one long-lived, hardened container per sandbox, driven by the agent.

* A sandbox is a container running the in-sandbox agent (sandboxes/agent/, the local
  provider's own) under tini, from the image built by scripts/build-sandbox-image.sh,
  as uid 1000 with every capability dropped, no-new-privileges, a read-only root,
  tmpfs for /workspace (sized by `disk_mb`; also HOME) and /tmp, pids/memory/CPU limits,
  ulimits and `network_mode=none` unless the spec asks for network.
* The sandbox id is also the container name (`<prefix>-<installation>-<id>`), so a
  duplicate id is refused atomically by the Engine.
* Every operation is one request to the agent's Unix socket. With a local engine the
  socket sits in a per-sandbox host directory (`agent_dir/<container name>/`, mode
  0700, owned by the sandbox uid) bind-mounted at /run/sandpit, so a command costs a
  connect and no Engine call; each container sees only its own directory. A remote
  engine (DOCKER_HOST tcp://) or gVisor, whose sockets live in its own kernel (a socket
  the agent binds in a bind mount is invisible to the host), gets one `docker exec` per
  connection running the agent's relay (relay.py).
* gVisor: `runtime='runsc'` (or a spec's `runtime`) runs sandboxes in gVisor's user-space
  kernel; networked ones take `gvisor_network_runtime` (see GVISOR_NETWORK_RUNTIME).
* The image carries the agent at a path naming its content hash (agent_bundle.py): an
  image built from other sources lacks it, and the sandbox fails with a rebuild hint.
* Terminals: the agent passes the PTY master to the host (SCM_RIGHTS), as in the local
  provider; over a relay it relays the bytes instead.

Notes on limits: tmpfs pages count against the container's memory limit, so `disk_mb`
of workspace data uses memory. The pids limit is `pids + _PIDS_HEADROOM` so the agent
and tini do not eat into the user's budget (scaled under gVisor: _host_pids_limit).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.types import Ulimit

from sandboxes.providers import agent_bundle
from sandboxes.providers import agent_client as wire
from sandboxes.providers.agent_client import (
    AgentExecStream,
    AgentPortStream,
    AgentPtySession,
    AgentRelayPtySession,
)
from sandboxes.providers.base import (
    Capability,
    ExecRequest,
    ExecResult,
    FileEntry,
    FileTooLarge,
    InvalidRequest,
    OpenPort,
    PathNotAllowed,
    ProcessInfo,
    ProviderError,
    ProviderHealth,
    ProviderNotConfigured,
    ProviderUnavailable,
    ResourceExhausted,
    SandboxGone,
    SandboxHandle,
    SandboxSpec,
    SandboxState,
    SandboxStats,
)

from .claims import forget_claim, read_claim
from .claims import view as pool_view
from .errors import translate
from .pool import CreateGate, DockerPool
from .relay import ExecBridge
from .sessions import DockerWatch
from .snapshot import DockerSnapshots

WORKSPACE = "/workspace"
AGENT_RUN_DIR = "/run/sandpit"
AGENT_SOCKET = f"{AGENT_RUN_DIR}/agent.sock"
_SANDBOX_UID = 1000
_SANDBOX_USER = f"{_SANDBOX_UID}:{_SANDBOX_UID}"
_PIDS_HEADROOM = 16
_MAX_PATH_BYTES = 4096
_SANDBOX_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_CONTAINER_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,200}")
_CONTAINER_REF = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,254}")
_ENGINE_CONNECTIONS = 64
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

CONTAINER = "container"
GVISOR = "gvisor"
GVISOR_NETWORK_RUNTIME = "runsc-net"
"""The gVisor runtime for networked sandboxes. The runsc Debian ships (2022-12) cannot use
its own network stack in Docker's bridge namespaces on current kernels (it takes every
namespace for the host's: it probes a sysctl that is no longer root-only), so networked
sandboxes run with runsc's --network=host: sockets go to the host kernel, inside the
container's own network namespace; everything else stays in gVisor. Offline sandboxes use
`runsc` with --network=none: even loopback is gVisor's."""
_RUNTIME_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_GVISOR_HOST_PIDS_BASE = 96
_GVISOR_HOST_PIDS_PER_PROCESS = 10
"""runsc on the ptrace platform runs about 50 host threads of its own and 8-9 more per
process inside (measured here): the host pids limit counts those, not sandbox processes."""


def isolation_of(runtime: str) -> str:
    """'gvisor' for a runsc runtime (by the name it is registered under), else 'container'."""
    return GVISOR if runtime.startswith("runsc") else CONTAINER


def _host_pids_limit(pids: int, runtime: str) -> int:
    """The engine's pids limit: the sandbox's processes plus Sandpit's helpers, scaled
    under gVisor to the host threads that many sandbox processes cost."""
    if isolation_of(runtime) == GVISOR:
        return _GVISOR_HOST_PIDS_BASE + (pids + _PIDS_HEADROOM) * _GVISOR_HOST_PIDS_PER_PROCESS
    return pids + _PIDS_HEADROOM


@dataclass(frozen=True)
class _Target:
    """How to reach one sandbox's agent."""

    cid: str
    socket_dir: Path | None
    """The host directory holding agent.sock; None: through a relay exec."""
    agent: str = ""
    """The agent bundle the container runs (its command's path in the image)."""


class DockerProvider(DockerSnapshots):
    """Sandboxes as hardened containers on a local (or DOCKER_HOST) Docker engine."""

    name = "docker"
    capabilities = frozenset(Capability)

    def __init__(
        self,
        image: str = "sandpit-sandbox:latest",
        base_url: str | None = None,
        label_prefix: str = "sandpit",
        installation: str = "default",
        max_file_bytes: int = 50 * 1024 * 1024,
        agent_dir: str | Path | None = None,
        runtime: str = "runc",
        gvisor_network_runtime: str = GVISOR_NETWORK_RUNTIME,
        relay: bool = False,
        tls: Any = None,
        pool_size: int = 0,
        create_concurrency: int = 0,
    ) -> None:
        """`relay=True` reaches every agent through `docker exec` even with a local engine
        (what remote engines and gVisor sandboxes always do; tests force it to cover it).
        `tls`: a docker.tls.TLSConfig for a tcp:// engine (engines.py builds it).
        `pool_size`: containers kept started for `create` to claim (0: none; pool.py);
        `create_concurrency`: cold creates at once against the Engine (0: no limit)."""
        self.image = image
        self.runtime = runtime
        self.gvisor_network_runtime = gvisor_network_runtime
        self.force_relay = relay
        self.tls = tls
        self.base_url = base_url or "unix:///var/run/docker.sock"
        self.label_prefix = label_prefix
        self.installation = installation
        self.max_file_bytes = max_file_bytes
        self.agent_dir = Path(
            agent_dir or Path(tempfile.gettempdir()) / f"sandpit-docker-agents-{os.geteuid()}"
        )
        self._client: Any = None
        self._lock = threading.Lock()
        self._targets: dict[str, _Target] = {}
        self._cpu_samples: dict[str, tuple[int, int]] = {}
        self._gate = CreateGate(create_concurrency)
        self.pool = DockerPool(self, pool_size, self._gate) if pool_size > 0 else None

    def close(self) -> None:
        """Remove the pool's unclaimed containers and stop refilling (also done at exit)."""
        if self.pool is not None:
            self.pool.close()

    @property
    def isolation(self) -> str:
        """What stands between sandboxes and the host kernel by default: 'container'
        (namespaces and cgroups, runc) or 'gvisor' (a user-space kernel, runsc)."""
        return isolation_of(self.runtime)

    def _runtime_for(self, spec: SandboxSpec) -> str:
        """The Docker runtime a sandbox runs under: the spec's, else ours; a networked
        gVisor sandbox takes the gVisor runtime registered for Docker's bridge."""
        runtime = spec.runtime or self.runtime
        if not _RUNTIME_NAME.fullmatch(runtime):
            raise InvalidRequest(f"Invalid Docker runtime name {runtime!r}.")
        if spec.network and isolation_of(runtime) == GVISOR:
            return self.gvisor_network_runtime
        return runtime

    # -- plumbing ----------------------------------------------------------

    def _api(self) -> Any:
        """The low-level client, built on first use (so a down engine fails calls, not imports)."""
        if self._client is None:
            with self._lock, translate():
                if self._client is None:
                    self._client = docker.APIClient(
                        base_url=self.base_url,
                        version="auto",
                        timeout=60,
                        tls=self.tls or False,
                        # docker-py keeps 10 connections by default: a burst of creates
                        # opened and dropped one per request past that.
                        max_pool_size=_ENGINE_CONNECTIONS,
                    )
        return self._client

    @property
    def local_engine(self) -> bool:
        """Whether the engine shares this host's file system (bind-mounted agent sockets)."""
        return self.base_url.startswith(("unix://", "/"))

    def _label(self, key: str) -> str:
        return f"{self.label_prefix}.{key}"

    def _target(self, provider_id: str) -> _Target:
        """How to reach the agent, after checking once that this installation owns it."""
        target = self._targets.get(provider_id)
        if target is not None:
            return target
        info = self._inspect(provider_id)
        if not self._is_ours(info["Config"].get("Labels") or {}):
            raise SandboxGone(f"Sandbox {provider_id} does not exist.")
        socket_dir = None
        for mount in info.get("Mounts") or []:
            if mount.get("Destination") == AGENT_RUN_DIR and mount.get("Type") == "bind":
                socket_dir = Path(mount["Source"])
        command = info["Config"].get("Cmd") or []
        agent = next((arg for arg in command if arg.startswith(agent_bundle.IMAGE_DIR)), "")
        target = _Target(provider_id, socket_dir, agent)
        if info["Id"].startswith(provider_id):
            self._targets[provider_id] = target
        return target

    def _cid(self, provider_id: str) -> str:
        return self._target(provider_id).cid

    def _inspect(self, provider_id: str) -> dict[str, Any]:
        if not _CONTAINER_REF.fullmatch(provider_id or ""):
            raise SandboxGone(f"Sandbox {provider_id!r} does not exist.")
        with translate(provider_id):
            return self._api().inspect_container(provider_id)

    def _is_ours(self, labels: Mapping[str, str]) -> bool:
        return (
            labels.get(self._label("managed")) == "1"
            and labels.get(self._label("installation")) == self.installation
        )

    def _handle(
        self, cid: str, state: str, created: datetime, labels: Mapping[str, str]
    ) -> SandboxHandle:
        states = {
            "running": SandboxState.RUNNING,
            "restarting": SandboxState.RUNNING,
            "created": SandboxState.STOPPED,
            "exited": SandboxState.STOPPED,
            "paused": SandboxState.RUNNING,  # frozen by pause(), alive
            "dead": SandboxState.ERROR,
            "removing": SandboxState.GONE,
        }
        return SandboxHandle(
            provider=self.name,
            provider_id=cid,
            state=states.get(state, SandboxState.ERROR),
            created_at=created,
            labels=dict(labels),
        )

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
        self, target: _Target, deadline: float, exc: Exception, ask_engine: bool
    ) -> None:
        """While the agent is not listening: a stopped container is gone (or never had
        this agent: an outdated image); past the deadline the agent is lost."""
        if target.socket_dir is not None and not target.socket_dir.is_dir():
            raise SandboxGone(f"Sandbox {target.cid} no longer exists.")
        if time.monotonic() >= deadline:
            raise self._lost(target, exc)
        if ask_engine:
            self._raise_if_stopped(target)

    def _raise_if_stopped(self, target: _Target, during_call: bool = False) -> None:
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

    def _lost(self, target: _Target, exc: Exception) -> ProviderError:
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

    def _relay(self, target: _Target, timeout: float) -> socket.socket:
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

    # -- lifecycle -----------------------------------------------------------

    def _agent_mount(
        self, name: str, runtime: str
    ) -> tuple[dict[str, Any], dict[str, str], Path | None]:
        """(binds, tmpfs, host dir) for the agent's run directory: a host directory the
        socket appears in, or (relay) a tmpfs only the container sees."""
        if not self.local_engine or self.force_relay or isolation_of(runtime) == GVISOR:
            tmpfs = {AGENT_RUN_DIR: f"rw,nosuid,nodev,size=1m,uid={_SANDBOX_UID},mode=0700"}
            return {}, tmpfs, None
        self.agent_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.agent_dir, 0o700)  # only the server (and root) may reach the sockets
        host_dir = self.agent_dir / name
        shutil.rmtree(host_dir, ignore_errors=True)  # a leftover of a crashed server
        host_dir.mkdir(mode=0o700)
        if os.geteuid() == 0:
            os.chown(host_dir, _SANDBOX_UID, _SANDBOX_UID)
        else:  # the sandbox uid must create its socket; the 0700 parent keeps others out
            os.chmod(host_dir, 0o777)  # noqa: S103 - see the comment above
        return {str(host_dir): {"bind": AGENT_RUN_DIR, "mode": "rw"}}, {}, host_dir

    def create(self, spec: SandboxSpec) -> SandboxHandle:
        """A sandbox for `spec`: a pool container when the spec is the common one and the
        pool has one ready (pool.py), else a new container (`_start_new`)."""
        if self.pool is not None and _SANDBOX_ID.fullmatch(spec.sandbox_id):
            runtime = self._runtime_for(spec)
            handle = self.pool.claim(spec, self._labels_for(spec, runtime))
            if handle is not None:
                return handle
        with self._gate.cold():
            handle = self._start_new(spec)
            # Its agent's start-up (a Python process) is much of a cold create's CPU: waiting
            # for it inside the queue keeps a burst in order (measured: the median of 50 at
            # once 3.7-4.7 s instead of 6.5-9 s). A socket ping costs nothing; a relay's
            # would be a docker exec, so those sandboxes' first call waits instead.
            if self._agent_socket_path(handle.provider_id) is not None:
                with contextlib.suppress(ProviderError):  # the first call says why
                    self._call(handle.provider_id, {"op": "ping"})
            return handle

    def _labels_for(self, spec: SandboxSpec, runtime: str) -> dict[str, str]:
        labels = {str(k): str(v) for k, v in spec.labels.items()}
        labels.update(
            {
                self._label("sandbox_id"): spec.sandbox_id,
                self._label("installation"): self.installation,
                self._label("managed"): "1",
                self._label("template"): spec.template,
                self._label("isolation"): isolation_of(runtime),
            }
        )
        return labels

    def _agent_socket_path(self, provider_id: str) -> Path | None:
        """Where the host reaches the sandbox's agent socket; None through a relay."""
        target = self._target(provider_id)
        return None if target.socket_dir is None else target.socket_dir / "agent.sock"

    def _start_new(self, spec: SandboxSpec) -> SandboxHandle:
        """Create and start a container; its agent takes requests shortly after (the
        first call waits for it)."""
        res = spec.resources
        if not _SANDBOX_ID.fullmatch(spec.sandbox_id):
            raise InvalidRequest("sandbox_id must be 1-64 letters, digits, '-' or '_'.")
        runtime = self._runtime_for(spec)
        labels = self._labels_for(spec, runtime)
        # HOME is the workspace, as in the local provider.
        env = ["HOME=/workspace", *_check_env(spec.env)]
        name = f"{self.label_prefix}-{self.installation}-{spec.sandbox_id}"
        disk_bytes = res.disk_mb * 1024 * 1024
        binds, agent_tmpfs, host_dir = self._agent_mount(name, runtime)
        socket_mode = 0o600 if os.geteuid() == 0 else 0o666
        command = [
            # The mark hides the agent from process listings; its children drop it.
            "/usr/bin/env",
            "SANDPIT_INTERNAL=1",
            "/usr/bin/python3",
            "-I",
            "-S",
            agent_bundle.image_path(),
            json.dumps({"socket": AGENT_SOCKET, "socket_mode": socket_mode}),
        ]
        api = self._api()
        try:
            with translate():
                host_config = api.create_host_config(
                    cap_drop=["ALL"],
                    security_opt=["no-new-privileges:true"],
                    pids_limit=_host_pids_limit(res.pids, runtime),
                    mem_limit=res.memory_mb * 1024 * 1024,
                    memswap_limit=res.memory_mb * 1024 * 1024,
                    nano_cpus=int(res.cpu_count * 1e9),
                    network_mode="bridge" if spec.network else "none",
                    read_only=True,
                    tmpfs={
                        WORKSPACE: f"rw,exec,nosuid,nodev,size={res.disk_mb}m,uid=1000,gid=1000,mode=0755",
                        "/tmp": "rw,exec,nosuid,nodev,size=64m,mode=1777",
                        **agent_tmpfs,
                    },
                    binds=binds,
                    ulimits=[
                        Ulimit(name="nofile", soft=res.open_files, hard=res.open_files),
                        Ulimit(name="fsize", soft=disk_bytes, hard=disk_bytes),
                        Ulimit(name="cpu", soft=res.cpu_time_s, hard=res.cpu_time_s),
                        Ulimit(name="core", soft=0, hard=0),
                    ],
                    init=False,
                    auto_remove=False,
                    runtime=runtime,
                )
                try:
                    created = api.create_container(
                        spec.image or self.image,  # a template's image, else ours
                        command=command,
                        name=name if _CONTAINER_NAME.fullmatch(name) else None,
                        user=_SANDBOX_USER,
                        working_dir=WORKSPACE,
                        hostname="sandbox",
                        labels=labels,
                        environment=env,
                        host_config=host_config,
                        network_disabled=not spec.network,
                    )
                except docker.errors.APIError as exc:
                    # The container name makes sandbox ids unique per installation, atomically.
                    if exc.status_code == 409:
                        raise InvalidRequest(f"Sandbox {spec.sandbox_id} already exists.") from exc
                    if "runtime" in str(exc.explanation or ""):
                        raise ProviderNotConfigured(
                            f"The Docker engine has no runtime {runtime!r} ({exc.explanation}); "
                            "register it (scripts/docker-up.sh registers runsc and runsc-net)."
                        ) from exc
                    raise
        except BaseException:
            if host_dir is not None and not _in_use_by_other(host_dir):
                shutil.rmtree(host_dir, ignore_errors=True)
            raise
        cid = created["Id"]
        try:
            with translate(cid):
                api.start(cid)
            if spec.restore_from:  # the snapshot's files, before anyone may use it
                self._restore_into(cid, spec.restore_from)
        except BaseException:
            with translate():
                try:
                    api.remove_container(cid, force=True)
                except docker.errors.NotFound:
                    pass
            if host_dir is not None:
                shutil.rmtree(host_dir, ignore_errors=True)
            raise
        self._targets[cid] = _Target(cid, host_dir, agent_bundle.image_path())
        return self._handle(cid, "running", datetime.now(UTC), labels)

    def get(self, provider_id: str) -> SandboxHandle:
        """Raises SandboxGone when it does not exist (or belongs to another installation)."""
        info = self._inspect(provider_id)
        labels = info["Config"].get("Labels") or {}
        if not self._is_ours(labels):
            raise SandboxGone(f"Sandbox {provider_id} does not exist.")
        shown = pool_view(self, info["Id"], info["Name"], labels, _parse_time(info["Created"]))
        if shown is None:  # an unclaimed pool container is no sandbox
            raise SandboxGone(f"Sandbox {provider_id} does not exist.")
        return self._handle(info["Id"], info["State"]["Status"], shown[1], shown[0])

    def list_sandboxes(self) -> list[SandboxHandle]:
        """Every container labelled for this installation, running or not (orphans included)."""
        with translate():
            rows = self._api().containers(
                all=True,
                filters={
                    "label": [
                        f"{self._label('managed')}=1",
                        f"{self._label('installation')}={self.installation}",
                    ]
                },
            )
        handles = []
        for row in rows:
            created = datetime.fromtimestamp(row["Created"], UTC)
            name = (row.get("Names") or [""])[0]
            shown = pool_view(self, row["Id"], name, row["Labels"] or {}, created)
            if shown is not None:  # None: an unclaimed pool container of a live server
                handles.append(self._handle(row["Id"], row["State"], shown[1], shown[0]))
        return handles

    def destroy(self, provider_id: str) -> bool:
        """Remove the container, its tmpfs data and its agent directory. False when it was
        already gone."""
        try:
            target = self._target(provider_id)
        except SandboxGone:
            return False
        try:
            with translate(provider_id):
                try:
                    self._api().remove_container(provider_id, force=True, v=True)
                except docker.errors.NotFound:
                    return False
                except docker.errors.APIError as exc:
                    if exc.status_code == 409 and "already in progress" in str(exc.explanation):
                        return False
                    raise
        finally:
            self._targets.pop(provider_id, None)
            self._cpu_samples.pop(provider_id, None)
            forget_claim(self, target.cid)
        if target.socket_dir is not None and target.socket_dir.parent == self.agent_dir:
            shutil.rmtree(target.socket_dir, ignore_errors=True)
        return True

    def set_timeout(self, provider_id: str, timeout_s: int) -> None:
        """The reaper enforces idle timeouts; here we only check the sandbox exists."""
        if timeout_s <= 0:
            raise InvalidRequest("timeout_s must be positive.")
        self._cid(provider_id)

    def stats(self, provider_id: str) -> SandboxStats:
        """CPU % since the previous call (since start on the first), memory, disk, network."""
        cid = self._cid(provider_id)
        api = self._api()
        with translate(cid):
            info = api.inspect_container(cid)
            if not info["State"]["Running"]:
                raise SandboxGone(f"Sandbox {provider_id} is not running.")
            raw = api.stats(cid, stream=False, one_shot=True)
        du = self.exec(provider_id, ExecRequest(command="du", args=["-s", "-B1", WORKSPACE]))
        try:
            disk = int(du.stdout.split()[0])
        except (IndexError, ValueError):
            disk = 0
        claim = read_claim(self, info["Id"])  # a pool container's life began when claimed
        started = claim[1] if claim else _parse_time(info["State"]["StartedAt"])
        uptime_s = max(0.0, (datetime.now(UTC) - started).total_seconds())
        cpu = raw.get("cpu_stats") or {}
        total = int((cpu.get("cpu_usage") or {}).get("total_usage") or 0)
        system = int(cpu.get("system_cpu_usage") or 0)
        ncpu = int(cpu.get("online_cpus") or 1)
        previous = self._cpu_samples.get(cid)
        self._cpu_samples[cid] = (total, system)
        if previous and system > previous[1]:
            cpu_percent = (total - previous[0]) / (system - previous[1]) * ncpu * 100.0
        elif uptime_s > 0:
            cpu_percent = total / (uptime_s * 1e9) * 100.0
        else:
            cpu_percent = 0.0
        mem = raw.get("memory_stats") or {}
        mem_stats = mem.get("stats") or {}
        cache = int(mem_stats.get("total_inactive_file") or mem_stats.get("inactive_file") or 0)
        memory = max(0, int(mem.get("usage") or 0) - cache)
        nets = (raw.get("networks") or {}).values()
        return SandboxStats(
            cpu_percent=round(max(cpu_percent, 0.0), 2),
            memory_bytes=memory,
            disk_bytes=disk,
            net_rx_bytes=sum(int(n.get("rx_bytes") or 0) for n in nets),
            net_tx_bytes=sum(int(n.get("tx_bytes") or 0) for n in nets),
            uptime_s=uptime_s,
            process_count=max(0, int((raw.get("pids_stats") or {}).get("current") or 0) - 2),
        )

    def health(self) -> ProviderHealth:
        """Ping the engine (and, for another runtime than runc, check the engine has it).
        Raises ProviderUnavailable when it does not answer."""
        started = time.perf_counter()
        with translate():
            self._api().ping()
            runtimes = self._api().info().get("Runtimes") or {} if self.runtime != "runc" else {}
        latency = (time.perf_counter() - started) * 1000.0
        detail = f"docker engine at {self.base_url}"
        if self.runtime != "runc":
            wanted = [self.runtime]
            if self.isolation == GVISOR:
                wanted.append(self.gvisor_network_runtime)
            missing = [name for name in wanted if name not in runtimes]
            if missing:
                return ProviderHealth(
                    ok=False,
                    detail=f"{detail} has no runtime {', '.join(missing)} "
                    "(scripts/docker-up.sh registers runsc and runsc-net)",
                    latency_ms=latency,
                )
            detail = f"{detail}, runtime {self.runtime}"
        return ProviderHealth(ok=True, detail=detail, latency_ms=latency)

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
        _check_env(env)
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
        _check_env(env)
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
        _check_env(env_d)
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
        _check_env(env_d)
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


def _in_use_by_other(host_dir: Path) -> bool:
    """Whether a live agent already listens in `host_dir` (a duplicate create)."""
    return (host_dir / "agent.sock").exists()


def _parse_time(value: str) -> datetime:
    """Docker's RFC 3339 timestamps carry nanoseconds; Python takes microseconds."""
    head, _, frac = value.rstrip("Z").partition(".")
    if frac:
        head = f"{head}.{frac[:6]}"
    parsed = datetime.fromisoformat(head)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _check_path(path: str) -> None:
    if not isinstance(path, str) or "\x00" in path or len(path.encode()) > _MAX_PATH_BYTES:
        raise PathNotAllowed("The path is malformed (NUL byte or longer than 4096 bytes).")


def _check_env(env: Mapping[str, str]) -> list[str]:
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
