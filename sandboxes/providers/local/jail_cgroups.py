"""The cgroups of local jails: one per jail under Sandpit's own, on cgroup v1 (a hierarchy
per controller) or v2 (the unified hierarchy), with its limits, counters, freezer and kill.

A jail's cgroups are a map of controller -> directory, kept in its state.json. On v1 each
controller has its own directory; on v2 the jail has one, named under the key UNIFIED and
under every controller it has (see UNIFIED). Every function here takes that map and does the
v1 or the v2 thing by that key.
"""

from __future__ import annotations

import errno
import hashlib
import os
import signal
import time
from pathlib import Path

from sandboxes.providers.base import Resources
from sandboxes.providers.local.jail import MIB, read_text

_CONTROLLERS = ("memory", "pids", "cpu", "cpuacct", "freezer")
# freezer: pause/resume (snapshot.py); joined from the jail's first instruction like the rest.
UNIFIED = "unified"
"""The key of a jail's cgroup on the unified (v2) hierarchy in its map of cgroups. There a
jail has one directory for everything; the map names it under this key and under each
controller it has: memory, pids and cpu where delegated to Sandpit, and always cpuacct and
freezer (cpu.stat and cgroup.freeze, which every v2 cgroup has)."""
_V2_LIMITS = ("memory", "pids", "cpu")
HOST_LEAF = "sandpit-host"
"""Where Sandpit moves the processes of its own v2 cgroup (see _v2_enable)."""
CGROUP_VERSIONS = ("auto", "v1", "v2")


def _own_cgroups() -> dict[str, str]:
    """Our cgroup per v1 controller, and on the unified hierarchy under the key UNIFIED."""
    out: dict[str, str] = {}
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                hierarchy, names, path = line.rstrip("\n").split(":", 2)
                if hierarchy == "0" and not names:
                    out[UNIFIED] = path
                for name in names.split(","):
                    if name:
                        out[name] = path
    except OSError:
        pass
    return out


def cgroup_scope(root_dir: Path) -> str:
    """The name of one jail root's cgroups under ``sandpit``: a digest of the root's path.

    Jails of two roots on one host (two installations, or two test workers) may carry the
    same sandbox id; in one shared parent, the second would join the first's cgroup, and
    destroying either would kill both."""
    return hashlib.sha256(str(root_dir.resolve()).encode()).hexdigest()[:16]


def cgroup_bases(scope: str, version: str = "auto") -> dict[str, str]:
    """Writable parents for the jails' cgroups, ``<our cgroup>/sandpit/<scope>``, by
    controller (see UNIFIED for v2).

    Nesting under our own cgroup keeps sandboxes inside whatever limits the host already
    puts on Sandpit. `auto` takes v1 where it gives both memory and pids limits (a host
    with every controller on v1, like this project's CI machine), else v2 where it gives
    any limit (a host with only the unified hierarchy: most current distributions), else
    whatever v1 gave."""
    if version not in CGROUP_VERSIONS:
        raise ValueError(f"cgroup version must be one of {', '.join(CGROUP_VERSIONS)}")
    v1 = _v1_bases(scope) if version != "v2" else {}
    if version == "v1" or {"memory", "pids"} <= v1.keys():
        return v1
    v2 = _v2_bases(scope)
    if version == "v2" or (v2.keys() & set(_V2_LIMITS)) or not v1:
        cgroup_scope_remove(v1)
        return v2
    cgroup_scope_remove(v2)
    return v1


def _v1_bases(scope: str) -> dict[str, str]:
    """Controllers mounted together (cpu,cpuacct) appear once."""
    own = _own_cgroups()
    bases: dict[str, str] = {}
    seen: set[str] = set()
    for ctrl in _CONTROLLERS:
        mount = f"/sys/fs/cgroup/{ctrl}"
        real = os.path.realpath(mount)
        if real in seen or ctrl not in own or not os.path.exists(f"{mount}/cgroup.procs"):
            continue
        base = f"{real}{own[ctrl].rstrip('/')}/sandpit/{scope}"
        try:
            os.makedirs(base, exist_ok=True)
        except OSError:
            continue
        if os.access(base, os.W_OK):
            seen.add(real)
            bases[ctrl] = base
    return bases


def unified_cgroup() -> str | None:
    """Our own directory on the unified hierarchy (our processes' cgroup before
    _v2_enable moved them into its HOST_LEAF), or None without a cgroup2 mount."""
    own = _own_cgroups().get(UNIFIED)
    if own is None:
        return None
    if own.rstrip("/").endswith(f"/{HOST_LEAF}"):
        own = own.rstrip("/").rsplit("/", 1)[0] or "/"
    mounts: list[tuple[str, str]] = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                sep = fields.index("-")
                if fields[sep + 1] == "cgroup2":
                    mounts.append((fields[4], fields[3]))  # mount point, root of the mount
    except (OSError, ValueError):
        return None
    # /sys/fs/cgroup itself on a v2-only host, /sys/fs/cgroup/unified on a hybrid one.
    for point, root in sorted(mounts, key=lambda m: len(m[0])):
        prefix = root.rstrip("/")
        if own == root or own.startswith(f"{prefix}/"):
            return f"{point.rstrip('/')}{own[len(prefix) :].rstrip('/')}"
    return None


def _v2_bases(scope: str, limits: tuple[str, ...] = _V2_LIMITS) -> dict[str, str]:
    top = unified_cgroup()
    if top is None:
        return {}
    base = f"{top}/sandpit/{scope}"
    try:
        os.makedirs(base, exist_ok=True)
    except OSError:
        return {}
    if not os.access(f"{base}/cgroup.procs", os.W_OK):
        return {}
    bases = {UNIFIED: base, "cpuacct": base}
    if os.path.exists(f"{base}/cgroup.freeze"):
        bases["freezer"] = base
    for ctrl in _v2_enable([top, f"{top}/sandpit", base], limits):
        bases[ctrl] = base
    return bases


def _v2_enable(chain: list[str], wanted: tuple[str, ...]) -> list[str]:
    """Enable the `wanted` controllers down `chain` (each the parent of the next) for the
    cgroups below its last; returns those that are.

    The kernel lets a cgroup other than the root hand controllers to its children only
    while no process sits in it. If ours holds processes, they are moved into its leaf
    HOST_LEAF first, keeping every limit they had, but only where the cgroup is Sandpit's
    to arrange: the root of a cgroup namespace (a container's) or a cgroup its manager
    delegated (systemd's ``Delegate=yes`` marks it ``trusted.delegate``)."""
    enabled = list(wanted)
    for depth, path in enumerate(chain):
        available = (read_text(f"{path}/cgroup.controllers") or "").split()
        enabled = [ctrl for ctrl in enabled if ctrl in available]
        for ctrl in list(enabled):
            error = _subtree_enable(path, ctrl)
            if error == errno.EBUSY and depth == 0 and _ours_to_arrange(path):
                _move_processes(path, f"{path}/{HOST_LEAF}")
                error = _subtree_enable(path, ctrl)
            if error:
                enabled.remove(ctrl)
    return enabled


def _subtree_enable(path: str, ctrl: str) -> int:
    """0, or the errno of the kernel's refusal."""
    if ctrl in (read_text(f"{path}/cgroup.subtree_control") or "").split():
        return 0
    try:
        with open(f"{path}/cgroup.subtree_control", "w") as f:
            f.write(f"+{ctrl}")
    except OSError as exc:
        return exc.errno or errno.EIO
    return 0


def _ours_to_arrange(path: str) -> bool:
    if _own_cgroups().get(UNIFIED) == "/" and path == unified_cgroup():
        return True  # the root of our cgroup namespace
    try:
        return os.getxattr(path, "trusted.delegate") == b"1"
    except OSError:
        return False


def _move_processes(source: str, leaf: str) -> None:
    try:
        os.makedirs(leaf, exist_ok=True)
    except OSError:
        return
    for _ in range(3):  # processes forked while moving the others
        pids = cgroup_pids(source)
        if not pids:
            return
        for pid in pids:
            _write(f"{leaf}/cgroup.procs", pid)


def _write(path: str, value: str | int) -> bool:
    try:
        with open(path, "w") as f:
            f.write(str(value))
        return True
    except OSError:
        return False


def cgroups_create(
    bases: dict[str, str], sandbox_id: str, res: Resources
) -> tuple[dict[str, str], bool]:
    """Create the sandbox's cgroups and write its limits; returns controller -> path, and
    whether every limit was written."""
    paths: dict[str, str] = {}
    made: dict[str, bool] = {}
    for ctrl, base in bases.items():
        if base not in made:
            made[base] = _mkdir_under(base, f"{base}/{sandbox_id}", unified=UNIFIED in bases)
        if made[base]:
            paths[ctrl] = f"{base}/{sandbox_id}"
    return paths, cgroups_set_limits(paths, res)


def _mkdir_under(base: str, path: str, *, unified: bool = False) -> bool:
    """Make the cgroup `path` in `base`, remaking `base` if a process of the same root removed
    it as empty meanwhile (cgroup_scope_remove); False when the host refuses. A v2 `base`
    made again hands its controllers down again."""
    for _ in range(3):
        try:
            if unified and not os.path.isdir(base):
                os.makedirs(base, exist_ok=True)
                parent = os.path.dirname(base)
                _v2_enable([base], tuple(_subtree(parent)))
            else:
                os.makedirs(base, exist_ok=True)
            os.mkdir(path)
        except FileExistsError:
            return True
        except FileNotFoundError:  # `base` went between the two calls: once more
            continue
        except OSError:
            return False
        return True
    return False


def _subtree(path: str) -> list[str]:
    return (read_text(f"{path}/cgroup.subtree_control") or "").split()


def cgroup_scope_remove(bases: dict[str, str]) -> None:
    """Remove a root's cgroup parents that are empty; one with a jail's cgroup in it stays
    (the kernel refuses to remove it)."""
    for base in set(bases.values()):
        try:
            os.rmdir(base)
        except OSError:
            pass


def cgroups_set_limits(paths: dict[str, str], res: Resources) -> bool:
    """Write `res` into existing cgroups (at creation, or when a warm jail is claimed).

    False when a limit could not be written, e.g. a memory limit below what the
    cgroup already uses (v1).
    """
    if UNIFIED in paths:
        return _v2_set_limits(paths, res)
    ok = True
    for ctrl, path in paths.items():
        if ctrl == "memory":
            limit = res.memory_mb * MIB
            memsw = f"{path}/memory.memsw.limit_in_bytes"
            if not os.path.exists(memsw):
                ok &= _write(f"{path}/memory.limit_in_bytes", limit)
            # memsw may never be below the plain limit: raise it first when growing,
            # lower it last when shrinking.
            elif _write(f"{path}/memory.limit_in_bytes", limit):
                ok &= _write(memsw, limit)
            else:
                ok &= _write(memsw, limit) and _write(f"{path}/memory.limit_in_bytes", limit)
        elif ctrl == "pids":
            ok &= _write(f"{path}/pids.max", res.pids)
        elif ctrl == "cpu":
            ok &= _write(f"{path}/cpu.cfs_period_us", 100_000)
            ok &= _write(f"{path}/cpu.cfs_quota_us", _cpu_quota_us(res))
    return ok


def _cpu_quota_us(res: Resources) -> int:
    return max(1000, int(res.cpu_count * 100_000))


def _v2_set_limits(paths: dict[str, str], res: Resources) -> bool:
    path = paths[UNIFIED]
    ok = True
    if "memory" in paths:
        ok &= _write(f"{path}/memory.max", res.memory_mb * MIB)
        # v1's memsw limit equal to the memory limit: no swap beyond it.
        if os.path.exists(f"{path}/memory.swap.max"):
            ok &= _write(f"{path}/memory.swap.max", 0)
    if "pids" in paths:
        ok &= _write(f"{path}/pids.max", res.pids)
    if "cpu" in paths:
        ok &= _write(f"{path}/cpu.max", f"{_cpu_quota_us(res)} 100000")
    return ok


def cgroups_set_background(paths: dict[str, str], background: bool) -> None:
    """Schedule the cgroup's tasks only when the CPU is otherwise idle (a warm jail
    starting while sandboxes run), or normally again."""
    path = paths.get("cpu")
    if path is None:
        return
    if os.path.exists(f"{path}/cpu.idle"):
        _write(f"{path}/cpu.idle", 1 if background else 0)
    elif UNIFIED in paths:
        _write(f"{path}/cpu.weight", 1 if background else 100)
    else:
        _write(f"{path}/cpu.shares", 2 if background else 1024)


def cgroups_reset_counters(paths: dict[str, str]) -> int:
    """Zero the CPU and peak-memory counters, so a warm jail's start-up is not billed to
    the sandbox that claims it. v2's cannot be zeroed: returns the CPU time (ns) to count
    from instead (0 on v1)."""
    if UNIFIED in paths:
        return cgroup_cpu_ns(paths) or 0
    for ctrl, path in paths.items():
        if ctrl == "cpuacct":
            _write(f"{path}/cpuacct.usage", 0)
        elif ctrl == "memory":
            _write(f"{path}/memory.max_usage_in_bytes", 0)
    return 0


def cgroup_cpu_ns(paths: dict[str, str]) -> int | None:
    """CPU time the cgroup's tasks used, in ns; None without the accounting."""
    path = paths.get("cpuacct")
    if path is None:
        return None
    if UNIFIED not in paths:
        text = read_text(f"{path}/cpuacct.usage")
        return int(text) if text and text.strip().isdigit() else None
    for line in (read_text(f"{path}/cpu.stat") or "").splitlines():
        if line.startswith("usage_usec "):
            return int(line.split()[1]) * 1000
    return None


def cgroup_memory_bytes(paths: dict[str, str]) -> int:
    """Memory charged to the cgroup now (0 without a memory cgroup)."""
    path = paths.get("memory")
    if path is None:
        return 0
    name = "memory.current" if UNIFIED in paths else "memory.usage_in_bytes"
    text = (read_text(f"{path}/{name}") or "").strip()
    return int(text) if text.isdigit() else 0


def cgroup_oom_kills(paths: dict[str, str]) -> int:
    """How many tasks the kernel killed for the cgroup's memory limit."""
    path = paths.get("memory")
    if path is None:
        return 0
    name = "memory.events" if UNIFIED in paths else "memory.oom_control"
    for line in (read_text(f"{path}/{name}") or "").splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return 0


def cgroups_join(paths: dict[str, str], pid: int) -> None:
    for path in set(paths.values()):
        _write(f"{path}/cgroup.procs", pid)


def cgroup_pids(path: str) -> list[int]:
    text = read_text(f"{path}/cgroup.procs") or ""
    return [int(x) for x in text.split()]


def cgroups_remove(paths: dict[str, str]) -> bool:
    """Kill whatever is still in the cgroups, then remove them (waits up to ~2 s).

    False when a cgroup still held processes at the deadline."""
    removed = True
    for path in set(paths.values()):
        if UNIFIED in paths:  # kills every task at once, forks in flight included
            _write(f"{path}/cgroup.kill", 1)
        deadline = time.monotonic() + 2.0
        while os.path.isdir(path):
            for pid in cgroup_pids(path):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            try:
                os.rmdir(path)
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    removed = False
                    break
                time.sleep(0.005)
    return removed
