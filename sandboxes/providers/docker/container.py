"""What a sandbox container is, for every part of the docker provider: its paths, its uid,
the runtimes it may run under (runc or gVisor) and the limits derived from them, and how
the host reaches its agent (AgentTarget).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

WORKSPACE = "/workspace"
AGENT_RUN_DIR = "/run/sandpit"
AGENT_SOCKET = f"{AGENT_RUN_DIR}/agent.sock"
SANDBOX_UID = 1000
SANDBOX_USER = f"{SANDBOX_UID}:{SANDBOX_UID}"
_PIDS_HEADROOM = 16
MAX_PATH_BYTES = 4096
SANDBOX_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
CONTAINER_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,200}")
CONTAINER_REF = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,254}")

CONTAINER = "container"
GVISOR = "gvisor"
GVISOR_NETWORK_RUNTIME = "runsc-net"
"""The gVisor runtime for networked sandboxes. The runsc Debian ships (2022-12) cannot use
its own network stack in Docker's bridge namespaces on current kernels (it takes every
namespace for the host's: it probes a sysctl that is no longer root-only), so networked
sandboxes run with runsc's --network=host: sockets go to the host kernel, inside the
container's own network namespace; everything else stays in gVisor. Offline sandboxes use
`runsc` with --network=none: even loopback is gVisor's."""
RUNTIME_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_GVISOR_HOST_PIDS_BASE = 96
_GVISOR_HOST_PIDS_PER_PROCESS = 10
"""runsc on the ptrace platform runs about 50 host threads of its own and 8-9 more per
process inside (measured here): the host pids limit counts those, not sandbox processes."""


def isolation_of(runtime: str) -> str:
    """'gvisor' for a runsc runtime (by the name it is registered under), else 'container'."""
    return GVISOR if runtime.startswith("runsc") else CONTAINER


def host_pids_limit(pids: int, runtime: str) -> int:
    """The engine's pids limit: the sandbox's processes plus Sandpit's helpers, scaled
    under gVisor to the host threads that many sandbox processes cost."""
    if isolation_of(runtime) == GVISOR:
        return _GVISOR_HOST_PIDS_BASE + (pids + _PIDS_HEADROOM) * _GVISOR_HOST_PIDS_PER_PROCESS
    return pids + _PIDS_HEADROOM


@dataclass(frozen=True)
class AgentTarget:
    """How to reach one sandbox's agent."""

    cid: str
    socket_dir: Path | None
    """The host directory holding agent.sock; None: through a relay exec."""
    agent: str = ""
    """The agent bundle the container runs (its command's path in the image)."""
