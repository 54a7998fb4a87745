"""What a pool container is, in a form every process can read: who owns an unclaimed one,
and which sandbox a claimed one became (see pool.py). Docker cannot change a container's
labels, so a claim is recorded in a file only the server reads, and get/list show it."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Protocol

POOL_LABEL = "pool"
"""Container label (under the provider's prefix) of pool containers: the owner token."""
POOL_ID_PREFIX = "pool-"
LEASE_S = 900.0
"""An unclaimed container whose owner cannot be checked from here is abandoned after this."""
CLAIMS_DIR = ".claims"


class _Provider(Protocol):
    """What these functions use of DockerProvider."""

    label_prefix: str
    installation: str
    agent_dir: Path

    def _label(self, key: str) -> str: ...


# --- owners ----------------------------------------------------------------------------


def _start_ticks(pid: int) -> int:
    """The process's start time in clock ticks since boot (0 when it does not exist)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return 0


def _node() -> str:
    """This host's boot and pid namespace: owners are comparable only within one node."""
    parts = []
    try:
        parts.append(Path("/proc/sys/kernel/random/boot_id").read_text().strip())
    except OSError:
        parts.append("")
    try:
        parts.append(os.readlink("/proc/self/ns/pid"))
    except OSError:
        parts.append("")
    parts.append(os.uname().nodename)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


NODE = _node()


def owner_token(pid: int | None = None) -> str:
    """`<node>-<pid>-<start ticks>` of `pid` (default: this process)."""
    pid = os.getpid() if pid is None else pid
    return f"{NODE}-{pid}-{_start_ticks(pid)}"


def owner_alive(token: str, created: datetime, now: datetime | None = None) -> bool:
    """Whether the process that owns an unclaimed container still runs. On this node: its
    pid with the same start time. Elsewhere: until the container is LEASE_S old."""
    try:
        node, pid_s, ticks_s = token.split("-")
        pid, ticks = int(pid_s), int(ticks_s)
    except ValueError:
        return False
    if node == NODE:
        return pid > 0 and _start_ticks(pid) == ticks
    now = now or datetime.now(UTC)
    return now - created < timedelta(seconds=LEASE_S)


# --- claims: what Docker cannot relabel -------------------------------------------------


def _claims_dir(provider: _Provider) -> Path:
    return Path(provider.agent_dir) / CLAIMS_DIR


def write_claim(provider: _Provider, cid: str, labels: Mapping[str, str], at: datetime) -> None:
    """Record a claimed container's sandbox labels and time of assignment (atomically)."""
    root = _claims_dir(provider)
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = root / f".{cid}.{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"labels": dict(labels), "assigned_at": at.isoformat()}, f)
    os.replace(tmp, root / f"{cid}.json")


def read_claim(provider: _Provider, cid: str) -> tuple[dict[str, str], datetime] | None:
    """(labels, assigned at) of a claimed container, None without a record."""
    if not cid or "/" in cid or cid.startswith("."):
        return None
    try:
        data = json.loads((_claims_dir(provider) / f"{cid}.json").read_text())
        return {str(k): str(v) for k, v in data["labels"].items()}, datetime.fromisoformat(
            data["assigned_at"]
        )
    except (OSError, ValueError, KeyError, AttributeError):
        return None


def forget_claim(provider: _Provider, cid: str) -> None:
    if cid and "/" not in cid and not cid.startswith("."):
        with contextlib.suppress(OSError):
            (_claims_dir(provider) / f"{cid}.json").unlink()


def unclaimed(provider: _Provider, name: str, labels: Mapping[str, str]) -> bool:
    """Whether a pool container still has its pool name (no sandbox took it)."""
    pool_id = labels.get(provider._label("sandbox_id"), "")
    installation = labels.get(provider._label("installation"), "")
    prefix = f"{provider.label_prefix}-{installation}-"
    return pool_id.startswith(POOL_ID_PREFIX) and name.lstrip("/") == prefix + pool_id


def view(
    provider: _Provider, cid: str, name: str, labels: Mapping[str, str], created: datetime
) -> tuple[dict[str, str], datetime] | None:
    """How a container shows in get/list: (labels, created_at), or None to hide it (an
    unclaimed pool container whose owner runs). A claimed pool container shows as the
    sandbox it became; an abandoned one as an orphan (its pool id as sandbox id)."""
    owner = labels.get(provider._label(POOL_LABEL))
    if owner is None:
        return dict(labels), created
    if unclaimed(provider, name, labels):
        return None if owner_alive(owner, created) else (dict(labels), created)
    claim = read_claim(provider, cid)
    if claim is not None:
        return claim
    prefix = f"{provider.label_prefix}-{provider.installation}-"
    name = name.lstrip("/")
    shown = {k: v for k, v in labels.items() if k != provider._label(POOL_LABEL)}
    if name.startswith(prefix):
        shown[provider._label("sandbox_id")] = name[len(prefix) :]
    return shown, created
