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
and tini do not eat into the user's budget (scaled under gVisor: host_pids_limit).

Modules by job: container.py (what a sandbox container is: paths, runtimes, limits),
create.py (the create path), operations.py (the agent connection and every operation over
it), snapshot.py (pause, resume, snapshots); this one holds the provider's configuration,
its Engine client and the lifecycle (get, list, destroy, stats, health).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import docker
import docker.errors

from sandboxes.providers import agent_bundle
from sandboxes.providers.base import (
    Capability,
    ExecRequest,
    InvalidRequest,
    ProviderHealth,
    SandboxGone,
    SandboxHandle,
    SandboxSpec,
    SandboxState,
    SandboxStats,
)

from .claims import forget_claim, read_claim
from .claims import view as pool_view
from .container import (
    AGENT_RUN_DIR,
    CONTAINER_REF,
    GVISOR,
    GVISOR_NETWORK_RUNTIME,
    RUNTIME_NAME,
    WORKSPACE,
    AgentTarget,
    isolation_of,
)
from .create import DockerCreate
from .errors import translate
from .pool import CreateGate, DockerPool

_ENGINE_CONNECTIONS = 64


class DockerProvider(DockerCreate):
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
        pool_max: int = 0,
        create_concurrency: int = 0,
    ) -> None:
        """`relay=True` reaches every agent through `docker exec` even with a local engine
        (what remote engines and gVisor sandboxes always do; tests force it to cover it).
        `tls`: a docker.tls.TLSConfig for a tcp:// engine (engines.py builds it).
        `pool_size`: containers kept started for `create` to claim (0: none; pool.py), and
        `pool_max` how many it may grow to after a burst;
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
        self._targets: dict[str, AgentTarget] = {}
        self._cpu_samples: dict[str, tuple[int, int]] = {}
        self._gate = CreateGate(create_concurrency)
        self.pool = (
            DockerPool(self, pool_size, self._gate, max_size=pool_max) if pool_size > 0 else None
        )

    def warm_pool_start(self) -> None:
        """Start filling the warm pool now rather than at the first create."""
        if self.pool is not None:
            self.pool.start()

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
        if not RUNTIME_NAME.fullmatch(runtime):
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

    def _target(self, provider_id: str) -> AgentTarget:
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
        target = AgentTarget(provider_id, socket_dir, agent)
        if info["Id"].startswith(provider_id):
            self._targets[provider_id] = target
        return target

    def _cid(self, provider_id: str) -> str:
        return self._target(provider_id).cid

    def _inspect(self, provider_id: str) -> dict[str, Any]:
        if not CONTAINER_REF.fullmatch(provider_id or ""):
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

    # -- lifecycle -----------------------------------------------------------

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


def _parse_time(value: str) -> datetime:
    """Docker's RFC 3339 timestamps carry nanoseconds; Python takes microseconds."""
    head, _, frac = value.rstrip("Z").partition(".")
    if frac:
        head = f"{head}.{frac[:6]}"
    parsed = datetime.fromisoformat(head)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
