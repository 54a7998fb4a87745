"""Docker provider: one long-lived, hardened container per sandbox.

This is the only module in Sandpit that imports `docker`. Everything the rest
of the project sees is a dataclass or error from `base`; docker-py objects and
errors never leave this file (`_translate` is the one place errors are mapped).

Design, in short:

* A sandbox is a container running `tini -- sleep infinity` from the image
  built by scripts/build-sandbox-image.sh, as uid 1000 with every capability
  dropped, no-new-privileges, a read-only root, tmpfs for /workspace (sized by
  `disk_mb`; also HOME, as in the local provider) and /tmp, pids/memory/CPU
  limits, ulimits and `network_mode=none` unless the spec asks for network.
  Creation is a plain create+start (no warm pool): it already costs about half
  of a `docker run --rm`, well inside the 1.2x budget.
* The sandbox id is also the container name (`<prefix>-<installation>-<id>`),
  so a duplicate id is refused atomically by the Engine.
* Every operation is an Engine exec. Commands run under `sandpit-run`, a small
  static C program baked into the image (docker/sandbox/sandpit-run.c, installed
  as `_RUNNER`; the path names its protocol version, so a provider never drives
  a runner it does not understand and an outdated image fails with a clear
  error). It starts the command in its own session, forwards stdin, caps output
  per stream, enforces the timeout by SIGKILLing the process group *and* every
  process tagged with the exec's nonce in its environment (which catches
  children that called setsid), and reports the exact wait status, CPU time and
  peak RSS in a nonce-marked trailer on stderr. So a command killed by signal N
  reports -N, unlike the Engine's 128+N, and no exec_inspect round trip is
  needed. It starts in about a millisecond; the Python wrapper it replaced cost
  ~13 ms of interpreter start-up per command (bench/bench_sandbox_api.py).
  Output beyond `max_output_bytes` is discarded while the command runs on
  (until it exits or times out), as in the local provider.
* File, process, port and cleanup operations go through `_AGENT`, Python whose
  source rides in each exec's environment (see `_PYTHON`), which applies the local provider's workspace rules with
  `realpath` inside the container. Background processes run under a small
  `sh` monitor that records their exit status in /tmp/.sandpit/procs.
* Anything Sandpit runs inside carries SANDPIT_INTERNAL=1 in its environment
  and is hidden from list_processes; sessions (PTY, watch, exec) carry a nonce
  tag so they can be killed as a tree, setsid or not.
* A PTY is a TTY exec whose hijacked socket is handed to the caller. The
  Engine scans TTY input for detach keys; ours are set to an unlikely
  four-key sequence (`_DETACH_KEYS`) instead of the default ctrl-p ctrl-q.
* A port stream is a non-TTY exec running a tiny TCP relay (`_PORT_RELAY`), so
  the input side is never scanned for detach keys (byte-transparent) and the
  output side is demultiplexed frame by frame straight from the socket.

Notes on limits: tmpfs pages count against the container's memory limit, so
`disk_mb` of workspace data uses memory. The pids limit is `pids +
_PIDS_HEADROOM` so Sandpit's own helper processes do not eat into the user's
budget (it is not a reservation: a fork bomb can fill it, and the running
wrapper then kills the bomb without needing a new process).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from typing import Any

import docker
import docker.errors
import requests.exceptions
from docker.types import Ulimit

from .base import (
    Capability,
    ExecRequest,
    ExecResult,
    FileConflict,
    FileEntry,
    FileEvent,
    FileNotFound,
    FileTooLarge,
    InvalidRequest,
    OpenPort,
    PathNotAllowed,
    ProcessInfo,
    ProcessNotFound,
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

WORKSPACE = "/workspace"
_SANDBOX_USER = "1000:1000"
_PIDS_HEADROOM = 16
_MAX_PATH_BYTES = 4096
_SANDBOX_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_CONTAINER_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,200}")
_CONTAINER_REF = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,254}")
_INLINE_CODE_MAX = 96 * 1024
"""Code longer than this goes through stdin: one argv string is capped at 128 KiB."""
_TRANSPORT_GRACE_S = 10.0
"""How long past a command's own timeout we wait for the wrapper before killing it ourselves."""
_HELPER_TIMEOUT_S = 60.0
_FRAME = struct.Struct(">BxxxI")
_DETACH_KEYS = "ctrl-^,ctrl-],ctrl-^,ctrl-]"
_PYTHON = ("/usr/bin/python3", "-I", "-S", "-c", "import os; exec(os.environ.pop('SANDPIT_CODE'))")
"""How in-container helpers start: the source rides in the environment so `ps`
inside the sandbox shows one short line instead of the whole script."""
_ERROR_MARK = b"\x00sandpit-error:"
_RUNNER = "/usr/local/lib/sandpit/run-v1"
"""The command runner in the image (docker/sandbox/sandpit-run.c); v1 is its protocol."""

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


def _host_pids_limit(pids: int, runtime: str) -> int:
    """The engine's pids limit: the sandbox's processes plus Sandpit's helpers, scaled
    under gVisor to the host threads that many sandbox processes cost."""
    if isolation_of(runtime) == GVISOR:
        return _GVISOR_HOST_PIDS_BASE + (pids + _PIDS_HEADROOM) * _GVISOR_HOST_PIDS_PER_PROCESS
    return pids + _PIDS_HEADROOM


def isolation_of(runtime: str) -> str:
    """'gvisor' for a runsc runtime (by the name it is registered under), else 'container'."""
    return GVISOR if runtime.startswith("runsc") else CONTAINER


_ERRORS: dict[str, type[ProviderError]] = {
    "file_not_found": FileNotFound,
    "path_not_allowed": PathNotAllowed,
    "file_conflict": FileConflict,
    "file_too_large": FileTooLarge,
    "process_not_found": ProcessNotFound,
    "invalid_request": InvalidRequest,
    "resource_exhausted": ResourceExhausted,
}

_LANGUAGES: dict[str, tuple[list[str], str]] = {
    # language -> (argv with {code} for inline code, suffix of the file for long code)
    "python": (["python3", "-c", "{code}"], ".py"),
    "node": (["node", "-e", "{code}"], ".js"),
    "bash": (["bash", "-c", "{code}"], ".sh"),
}
_LANGUAGE_FILE_ARGV: dict[str, list[str]] = {
    "python": ["python3", "{file}"],
    "node": ["node", "{file}"],
    "bash": ["bash", "{file}"],
}

# ---------------------------------------------------------------------------
# Code that runs inside the container (see _PYTHON). Python 3.11, stdlib only.
# ---------------------------------------------------------------------------

_AGENT = r"""
import _signal, errno, json, os, stat as S, sys, time
WS = "/workspace"
STATE = "/tmp/.sandpit/procs"
class Fail(Exception):
    def __init__(self, code, message):
        self.code, self.message = code, message
OS_CODES = {
    errno.ENOENT: "file_not_found", errno.ENOTDIR: "file_conflict", errno.EISDIR: "file_conflict",
    errno.EEXIST: "file_conflict", errno.ENOTEMPTY: "file_conflict", errno.EBUSY: "file_conflict",
    errno.EINVAL: "file_conflict",
    errno.ENOSPC: "resource_exhausted", errno.EDQUOT: "resource_exhausted",
    errno.EFBIG: "resource_exhausted", errno.EACCES: "path_not_allowed", errno.EPERM: "path_not_allowed",
    errno.ELOOP: "path_not_allowed", errno.ENAMETOOLONG: "path_not_allowed",
}
def rel(p):
    return "" if p == WS else p[len(WS) + 1:]
def inside(p):
    return p == WS or p.startswith(WS + "/")
def resolve(path, follow=True):
    if not isinstance(path, str) or "\0" in path or len(path.encode()) > 4096:
        raise Fail("path_not_allowed", "malformed path")
    full = path if path.startswith("/") else os.path.join(WS, path)
    head, name = os.path.split(full.rstrip("/") or "/")
    if name in ("", ".", ".."):
        lex = os.path.realpath(full)
    else:
        lex = os.path.join(os.path.realpath(head), name)
    if not inside(lex):
        raise Fail("path_not_allowed", "path escapes the workspace: " + path)
    real = os.path.realpath(lex)
    if follow and not inside(real):
        raise Fail("path_not_allowed", "path escapes the workspace: " + path)
    return lex, real
def entry(lex, st=None):
    st = st or os.lstat(lex)
    kind = "symlink" if S.S_ISLNK(st.st_mode) else "dir" if S.S_ISDIR(st.st_mode) else "file"
    return {"name": os.path.basename(lex) if lex != WS else "", "path": rel(lex), "type": kind,
            "size": st.st_size, "mtime": st.st_mtime}
def op_read(a):
    lex, real = resolve(a["path"])
    st = os.stat(real)
    if S.S_ISDIR(st.st_mode):
        raise Fail("file_conflict", "is a directory: " + a["path"])
    if not S.S_ISREG(st.st_mode):
        raise Fail("file_conflict", "not a regular file: " + a["path"])
    off = max(0, a.get("offset") or 0)
    n = max(0, st.st_size - off)
    if a.get("length") is not None:
        n = min(n, max(0, a["length"]))
    if n > a["max"]:
        raise Fail("file_too_large", "file is %d bytes; the limit is %d" % (n, a["max"]))
    with open(real, "rb") as f:
        f.seek(off)
        data = f.read(n)
    out = sys.stdout.buffer
    out.write(b"%d\n" % len(data))
    out.write(data)
    out.flush()
    return None
def op_write(a):
    lex, real = resolve(a["path"])
    if os.path.isdir(real):
        raise Fail("file_conflict", "is a directory: " + a["path"])
    if os.path.exists(real) and not os.path.isfile(real):
        raise Fail("file_conflict", "not a regular file: " + a["path"])
    os.makedirs(os.path.dirname(real), exist_ok=True)
    data = sys.stdin.buffer.read()
    if len(data) != a["size"]:
        raise Fail("provider_error", "short write: got %d of %d bytes" % (len(data), a["size"]))
    with open(real, "wb") as f:
        f.write(data)
    return entry(lex)
def op_mkdir(a):
    lex, real = resolve(a["path"])
    if os.path.lexists(real) and not os.path.isdir(real):
        raise Fail("file_conflict", "exists and is not a directory: " + a["path"])
    os.makedirs(real, exist_ok=True)
    return entry(lex)
def op_list(a):
    lex, real = resolve(a["path"])
    if not os.path.isdir(real):
        if os.path.lexists(real):
            raise Fail("file_conflict", "not a directory: " + a["path"])
        raise Fail("file_not_found", "no such directory: " + a["path"])
    out = []
    def walk(dir_real, dir_lex):
        with os.scandir(dir_real) as it:
            items = sorted(it, key=lambda e: e.name)
        for e in items:
            if len(out) >= 100000:
                return
            p = os.path.join(dir_lex, e.name)
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            out.append(entry(p, st))
            if a.get("recursive") and S.S_ISDIR(st.st_mode):
                walk(os.path.join(dir_real, e.name), p)
    walk(real, lex)
    return out
def op_stat(a):
    lex, real = resolve(a["path"], follow=False)
    return entry(lex)
def op_exists(a):
    lex, real = resolve(a["path"], follow=False)
    return os.path.lexists(lex)
def op_remove(a):
    lex, real = resolve(a["path"], follow=False)
    if lex == WS:
        raise Fail("path_not_allowed", "cannot remove the workspace root")
    st = os.lstat(lex)
    if S.S_ISDIR(st.st_mode):
        if a.get("recursive"):
            import shutil
            shutil.rmtree(lex)
        else:
            os.rmdir(lex)
    else:
        os.unlink(lex)
    return None
def op_move(a):
    src, _ = resolve(a["src"], follow=False)
    dst, _ = resolve(a["dst"], follow=False)
    if src == WS or dst == WS:
        raise Fail("path_not_allowed", "cannot move the workspace root")
    os.lstat(src)
    if os.path.lexists(dst):
        raise Fail("file_conflict", "destination exists: " + a["dst"])
    if (dst + "/").startswith(src + "/"):
        raise Fail("file_conflict", "cannot move a directory into itself")
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    os.rename(src, dst)
    return entry(dst)
def proc_env(pid):
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []
def proc_info(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            raw = f.read()
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            cmd = f.read()
    except OSError:
        return None
    rest = raw[raw.rindex(b")") + 2:].split()
    return {"state": rest[0].decode(), "ppid": int(rest[1]), "pgid": int(rest[2]),
            "start_ticks": int(rest[19]), "cmdline": cmd}
def boot_time():
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("btime "):
                return int(line.split()[1])
    return 0
def pids():
    return sorted(int(n) for n in os.listdir("/proc") if n.isdigit())
def hidden(pid, info):
    if pid == 1 or pid == os.getpid():
        return True
    if info["ppid"] == 1 and info["cmdline"] == b"sleep\0infinity\0" and pid < 16:
        return True
    return b"SANDPIT_INTERNAL=1" in proc_env(pid)
def records():
    out = {}
    try:
        names = os.listdir(STATE)
    except OSError:
        return out
    for n in names:
        if n.endswith(".json"):
            try:
                with open(os.path.join(STATE, n)) as f:
                    out[int(n[:-5])] = json.load(f)
            except (OSError, ValueError):
                pass
    return out
def exit_code_of(pid):
    try:
        with open(os.path.join(STATE, "%d.exit" % pid)) as f:
            n = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return -(n - 128) if 128 < n < 128 + 65 else n
def op_ps(a):
    hz = os.sysconf("SC_CLK_TCK")
    bt = boot_time()
    recs = records()
    out, seen = [], set()
    for pid in pids():
        info = proc_info(pid)
        if info is None or hidden(pid, info):
            continue
        running = info["state"] != "Z"
        rec = recs.get(pid)
        cmd = rec["command"] if rec else info["cmdline"].rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")
        out.append({"pid": pid, "command": cmd, "running": running, "exit_code": None,
                    "started_at": bt + info["start_ticks"] / hz})
        seen.add(pid)
    for pid, rec in sorted(recs.items()):
        if pid not in seen:
            out.append({"pid": pid, "command": rec["command"], "running": False,
                        "exit_code": exit_code_of(pid), "started_at": rec["started_at"]})
    return out
def op_kill(a):
    pid, sig = a["pid"], a["signal"]
    if not 0 <= sig < _signal.NSIG:
        raise Fail("invalid_request", "unknown signal %r" % sig)
    info = proc_info(pid) if pid > 0 else None
    if info is None or hidden(pid, info):
        raise Fail("process_not_found", "no such process: %d" % pid)
    try:
        if info["pgid"] == pid and pid in records():
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        raise Fail("process_not_found", "no such process: %d" % pid)
    except PermissionError:
        raise Fail("process_not_found", "no such process: %d" % pid)
    return None
MONITOR = 'd=$1; shift; unset SANDPIT_INTERNAL; setsid "$@" </dev/null >/dev/null 2>&1 & p=$!; echo $p; exec >/dev/null; wait $p; echo $? > "$d/$p.exit"'
def op_spawn(a):
    cwd = a.get("cwd") or WS
    real = os.path.realpath(cwd if cwd.startswith("/") else os.path.join(WS, cwd))
    if not os.path.isdir(real):
        raise Fail("file_not_found", "working directory does not exist: " + cwd)
    os.makedirs(STATE, exist_ok=True)
    env = dict(os.environ)
    env.update(a.get("env") or {})
    env["SANDPIT_INTERNAL"] = "1"
    r, w = os.pipe()
    started = time.time()
    pid = os.fork()
    if pid == 0:
        os.setsid()
        null = os.open("/dev/null", os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(w, 1)
        os.dup2(null, 2)
        os.closerange(3, 65536)
        os.chdir(real)
        os.execve("/bin/sh", ["sh", "-c", MONITOR, "sh", STATE] + a["argv"], env)
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 64)
        if not chunk:
            break
        data += chunk
    child = int(data.strip())
    rec = {"command": a["command"], "started_at": started}
    with open(os.path.join(STATE, "%d.json" % child), "w") as f:
        json.dump(rec, f)
    return {"pid": child, "command": a["command"], "running": True, "exit_code": None,
            "started_at": started}
def op_killtag(a):
    tag = a["tag"].encode()
    killed = 0
    for _ in range(20):
        found = [p for p in pids() if p != os.getpid() and tag in proc_env(p)]
        if not found:
            break
        for p in found:
            try:
                os.kill(p, 9)
                killed += 1
            except OSError:
                pass
        time.sleep(0.01)
    return killed
def op_ports(a):
    import socket
    out = []
    for name, fam in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            with open("/proc/net/" + name) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) < 4 or parts[3] != "0A":
                continue
            addr, port = parts[1].split(":")
            raw = bytes.fromhex(addr)
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            out.append({"port": int(port, 16), "address": socket.inet_ntop(fam, raw)})
    seen, uniq = set(), []
    for p in sorted(out, key=lambda p: (p["port"], p["address"])):
        if (p["port"], p["address"]) not in seen:
            seen.add((p["port"], p["address"]))
            uniq.append(p)
    return uniq
OPS = {"read": op_read, "write": op_write, "mkdir": op_mkdir, "list": op_list, "stat": op_stat,
       "exists": op_exists, "remove": op_remove, "move": op_move, "ps": op_ps, "kill": op_kill,
       "spawn": op_spawn, "killtag": op_killtag, "ports": op_ports}
def fail(code, message):
    sys.stderr.buffer.write(b"\0sandpit-error:" + json.dumps({"code": code, "message": message}).encode())
    sys.stderr.flush()
    sys.exit(3)
try:
    result = OPS[sys.argv[1]](json.loads(sys.argv[2]))
    if sys.argv[1] != "read":
        sys.stdout.write(json.dumps(result))
except Fail as e:
    fail(e.code, e.message)
except OSError as e:
    fail(OS_CODES.get(e.errno, "provider_error"), "%s: %s" % (e.strerror, e.filename or ""))
"""

_PORT_RELAY = r"""
import os, select, socket, sys
try:
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
except OSError as e:
    os.write(2, b"SANDPIT-PORT-ERR %d\n" % (e.errno or 0))
    sys.exit(1)
s.settimeout(None)
os.write(2, b"SANDPIT-PORT-OK\n")
to_server = True
while True:
    r, _, _ = select.select([0, s] if to_server else [s], [], [])
    if 0 in r:
        data = os.read(0, 1 << 16)
        if data:
            s.sendall(data)
        else:
            s.shutdown(socket.SHUT_WR)
            to_server = False
    if s in r:
        data = s.recv(1 << 16)
        if not data:
            break
        view = memoryview(data)
        while view:
            view = view[os.write(1, view):]
"""

_WATCH_EVENTS = "create,delete,modify,close_write,moved_from,moved_to"
_WATCH_BATCH_S = 0.05


# ---------------------------------------------------------------------------
# Error translation: the one place docker-py errors become ours
# ---------------------------------------------------------------------------


@contextmanager
def _translate(provider_id: str | None = None) -> Iterator[None]:
    try:
        yield
    except ProviderError:
        raise
    except docker.errors.ImageNotFound as exc:
        raise ProviderNotConfigured(
            f"Sandbox image missing ({exc.explanation}); run scripts/build-sandbox-image.sh."
        ) from exc
    except docker.errors.NotFound as exc:
        if provider_id is None:
            raise ProviderError(str(exc.explanation)) from exc
        raise SandboxGone(f"Sandbox {provider_id} no longer exists.") from exc
    except docker.errors.APIError as exc:
        text = str(exc.explanation or exc)
        if exc.status_code == 409 and ("not running" in text or "paused" in text):
            raise SandboxGone(f"Sandbox {provider_id} is not running.") from exc
        if "no space left" in text:
            raise ResourceExhausted(text) from exc
        if exc.status_code is not None and exc.status_code >= 500 and "connect" in text:
            raise ProviderUnavailable(text) from exc
        raise ProviderError(f"Docker engine error: {text}") from exc
    except (requests.exceptions.ConnectionError, requests.exceptions.Timeout) as exc:
        raise ProviderUnavailable(f"The Docker engine cannot be reached: {exc}") from exc
    except docker.errors.DockerException as exc:
        raise ProviderUnavailable(f"The Docker engine cannot be reached: {exc}") from exc
    except (ConnectionError, TimeoutError) as exc:
        raise ProviderUnavailable(f"Lost the connection to the Docker engine: {exc}") from exc


def _raw_socket(stream: Any) -> socket.socket:
    """The OS socket under what exec_start(socket=True) returned."""
    return getattr(stream, "_sock", stream)


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


class _Frames:
    """Incremental parser of the Engine's multiplexed stdout/stderr stream."""

    def __init__(self, caps: tuple[int, int]) -> None:
        self.buf = bytearray()
        self.out = bytearray()
        self.err = bytearray()
        self.caps = caps
        self.out_truncated = False
        self.err_truncated = False

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self.buf += data
        frames = []
        while len(self.buf) >= _FRAME.size:
            stream, size = _FRAME.unpack_from(self.buf)
            end = _FRAME.size + size
            if len(self.buf) < end:
                break
            frames.append((stream, bytes(self.buf[_FRAME.size : end])))
            del self.buf[:end]
        return frames

    def collect(self, data: bytes) -> None:
        for stream, payload in self.feed(data):
            if stream == 2:
                room = self.caps[1] - len(self.err)
                self.err += payload[: max(room, 0)]
                self.err_truncated |= len(payload) > room
            else:
                room = self.caps[0] - len(self.out)
                self.out += payload[: max(room, 0)]
                self.out_truncated |= len(payload) > room


# ---------------------------------------------------------------------------
# Live sessions
# ---------------------------------------------------------------------------


class DockerPtySession:
    """A shell on a TTY exec; `fileno()` is the exec's hijacked socket (non-blocking)."""

    def __init__(self, provider: DockerProvider, cid: str, exec_id: str, stream: Any, tag: str):
        self._provider = provider
        self._cid = cid
        self._exec_id = exec_id
        self._stream = stream
        self._sock = _raw_socket(stream)
        self._sock.setblocking(False)
        self._tag = tag
        self._exit_code: int | None = None
        self._closed = False

    def fileno(self) -> int:
        return self._sock.fileno()

    def read(self, max_bytes: int = 65536) -> bytes:
        if self._closed:
            return b""
        try:
            return self._sock.recv(max_bytes)
        except (ConnectionResetError, BrokenPipeError):
            return b""

    def write(self, data: bytes) -> None:
        if self._closed:
            raise SandboxGone("The terminal is closed.")
        view = memoryview(data)
        deadline = time.monotonic() + 10.0
        while view:
            try:
                view = view[self._sock.send(view) :]
            except BlockingIOError:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ProviderError("The terminal is not accepting input.") from None
                select.select([], [self._sock], [], remaining)
            except (ConnectionResetError, BrokenPipeError) as exc:
                raise SandboxGone("The terminal has ended.") from exc

    def resize(self, cols: int, rows: int) -> None:
        if self._closed:
            return
        with _translate(self._cid):
            try:
                self._provider._api().exec_resize(self._exec_id, height=rows, width=cols)
            except docker.errors.APIError as exc:
                # Resizing a shell that just exited is not an error worth a 5xx.
                if exc.status_code not in (404, 409, 500):
                    raise

    def exit_code(self) -> int | None:
        if self._exit_code is None:
            with _translate(self._cid):
                info = self._provider._api().exec_inspect(self._exec_id)
            if not info.get("Running") and info.get("ExitCode") is not None:
                self._exit_code = int(info["ExitCode"])
        return self._exit_code

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._provider._kill_tag(self._cid, self._tag)
        except ProviderError:
            pass
        finally:
            self._sock.close()
            self._stream.close()


class DockerPortStream:
    """A relay exec to 127.0.0.1:port inside the container, as a plain byte stream.

    The exec has no TTY: a TTY would make the Engine scan our bytes for its
    detach keys and cut the stream. Without one, the Engine frames output as
    [stream, 0, 0, 0, size] + payload. After the relay's greeting (`greet`), two
    threads bridge the exec socket onto one end of a socketpair, dropping the
    frame headers on the way out; `fileno()` is the other end. So, as the
    PortStream contract says, the descriptor carries exactly the port's bytes:
    callers may select on it or hand a duplicate to asyncio or websockets.
    """

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._raw = _raw_socket(stream)
        self._raw.setblocking(True)
        self._sock: socket.socket | None = None
        self._closed = False

    def _read_exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self._raw.recv(n - len(data))
            if not chunk:
                return b""
            data += chunk
        return data

    def greet(self, timeout_s: float) -> bytes:
        """The relay's first stderr frame (sent before any payload), then start bridging."""
        self._raw.settimeout(timeout_s)
        try:
            header = self._read_exactly(_FRAME.size)
            stream_id, size = _FRAME.unpack(header) if header else (0, 0)
            greeting = self._read_exactly(size) if stream_id == 2 else b""
        except OSError:
            greeting = b""
        self._raw.settimeout(None)
        self._sock, inner = socket.socketpair()
        threading.Thread(target=self._demultiplex, args=(inner,), daemon=True).start()
        threading.Thread(target=self._forward, args=(inner,), daemon=True).start()
        return greeting

    def _demultiplex(self, inner: socket.socket) -> None:
        """Exec output frames -> the socketpair: stdout payloads only (stderr is the relay's)."""
        try:
            while header := self._read_exactly(_FRAME.size):
                stream_id, size = _FRAME.unpack(header)
                while size:
                    chunk = self._raw.recv(min(size, 65536))
                    if not chunk:
                        return
                    size -= len(chunk)
                    if stream_id == 1:
                        inner.sendall(chunk)
        except OSError:
            pass
        finally:
            with suppress(OSError):
                inner.shutdown(socket.SHUT_WR)

    def _forward(self, inner: socket.socket) -> None:
        """The socketpair -> the exec's stdin (not framed); EOF ends the relay's input."""
        try:
            while chunk := inner.recv(65536):
                self._raw.sendall(chunk)
        except OSError:
            pass
        finally:
            with suppress(OSError):
                self._raw.shutdown(socket.SHUT_WR)
            inner.close()

    def fileno(self) -> int:
        assert self._sock is not None, "greet() first"
        return self._sock.fileno()

    def recv(self, max_bytes: int = 65536) -> bytes:
        """Up to max_bytes from the port; b"" when either side closed."""
        assert self._sock is not None, "greet() first"
        try:
            return self._sock.recv(max_bytes)
        except (ConnectionResetError, BrokenPipeError):
            return b""

    def sendall(self, data: bytes) -> None:
        assert self._sock is not None, "greet() first"
        self._sock.sendall(data)

    def close(self) -> None:
        """Closing the exec's stdin ends the relay (and its TCP connection) inside."""
        if self._closed:
            return
        self._closed = True
        for sock in (self._sock, self._raw):
            if sock is None:
                continue
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self._stream.close()


class DockerWatch:
    """Iterator of FileEvent batches from an `inotifywait -m` exec; `close()` ends it.

    Events closer than `_WATCH_BATCH_S` to the first one of a batch are
    delivered together. A class rather than a generator so that `close()`
    stops the watcher even when nobody ever iterated.
    """

    def __init__(
        self, provider: DockerProvider, cid: str, stream: Any, frames: _Frames, tag: str
    ) -> None:
        self._provider = provider
        self._cid = cid
        self._stream = stream
        self._sock = _raw_socket(stream)
        self._frames = frames
        self._pending = bytes(frames.out)
        self._tag = tag
        self._closed = False

    def __iter__(self) -> DockerWatch:
        return self

    def __next__(self) -> list[FileEvent]:
        while not self._closed:
            events = _file_events(self._next_records())
            if events:
                return events
        raise StopIteration

    def _next_records(self) -> list[tuple[str, str]]:
        batch: list[tuple[str, str]] = []
        batch_deadline: float | None = None
        while True:
            *records, self._pending = self._pending.split(b"\x00")
            for record in records:
                kinds, _, full = record.decode("utf-8", "surrogateescape").partition(" ")
                batch.append((kinds, full))
            if batch and batch_deadline is None:
                batch_deadline = time.monotonic() + _WATCH_BATCH_S
            timeout = None if batch_deadline is None else batch_deadline - time.monotonic()
            if timeout is not None and timeout <= 0:
                return batch
            try:
                ready, _, _ = select.select([self._sock], [], [], timeout)
                chunk = self._sock.recv(65536) if ready else None
            except (OSError, ValueError):
                chunk = b""
            if chunk is None:
                return batch
            if not chunk:
                self.close()
                return batch
            for stream_id, payload in self._frames.feed(chunk):
                if stream_id == 1:
                    self._pending += payload

    def close(self) -> None:
        """Stop the watcher inside the sandbox; idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        self._stream.close()
        try:
            self._provider._kill_tag(self._cid, self._tag)
        except ProviderError:
            pass


# ---------------------------------------------------------------------------
# The provider
# ---------------------------------------------------------------------------


class DockerProvider:
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
        runtime: str = "runc",
        gvisor_network_runtime: str = GVISOR_NETWORK_RUNTIME,
    ) -> None:
        self.image = image
        self.runtime = runtime
        self.gvisor_network_runtime = gvisor_network_runtime
        self.base_url = base_url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        self.label_prefix = label_prefix
        self.installation = installation
        self.max_file_bytes = max_file_bytes
        self._client: Any = None
        self._lock = threading.Lock()
        self._owned: set[str] = set()
        self._cpu_samples: dict[str, tuple[int, int]] = {}

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
            with self._lock, _translate():
                if self._client is None:
                    self._client = docker.APIClient(
                        base_url=self.base_url, version="auto", timeout=60
                    )
        return self._client

    def _label(self, key: str) -> str:
        return f"{self.label_prefix}.{key}"

    def _cid(self, provider_id: str) -> str:
        """The container id, after checking once that this installation owns it."""
        if provider_id in self._owned:
            return provider_id
        info = self._inspect(provider_id)
        if not self._is_ours(info["Config"].get("Labels") or {}):
            raise SandboxGone(f"Sandbox {provider_id} does not exist.")
        if info["Id"].startswith(provider_id):
            self._owned.add(provider_id)
        return provider_id

    def _inspect(self, provider_id: str) -> dict[str, Any]:
        if not _CONTAINER_REF.fullmatch(provider_id or ""):
            raise SandboxGone(f"Sandbox {provider_id!r} does not exist.")
        with _translate(provider_id):
            return self._api().inspect_container(provider_id)  # type: ignore[no-any-return]

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
            "paused": SandboxState.STOPPED,
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

    def _exec_raw(
        self,
        cid: str,
        cmd: Sequence[str],
        *,
        env: Sequence[str] | None = None,
        stdin: bytes | None = None,
        timeout_s: float = _HELPER_TIMEOUT_S,
        caps: tuple[int, int] = (1 << 62, 1 << 62),
    ) -> tuple[_Frames, bool, str]:
        """Run one exec to completion: (frames, transport timed out, exec id)."""
        api = self._api()
        with _translate(cid):
            exec_id = api.exec_create(
                cid, list(cmd), stdin=stdin is not None, environment=list(env or [])
            )["Id"]
            stream = api.exec_start(exec_id, socket=True)
        sock = _raw_socket(stream)
        frames = _Frames(caps)
        deadline = time.monotonic() + timeout_s
        pending = memoryview(stdin) if stdin is not None else None
        try:
            with _translate(cid):
                sock.setblocking(False)
                if pending is not None and not pending:
                    sock.shutdown(socket.SHUT_WR)
                    pending = None
                while True:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return frames, True, exec_id
                    writers = [sock] if pending is not None else []
                    readable, writable, _ = select.select([sock], writers, [], remaining)
                    if writable and pending is not None:
                        try:
                            pending = pending[sock.send(pending[:262144]) :]
                        except BlockingIOError:
                            pass
                        except (BrokenPipeError, ConnectionResetError):
                            pending = memoryview(b"")
                        if not pending:
                            pending = None
                            try:
                                sock.shutdown(socket.SHUT_WR)
                            except OSError:
                                pass
                    if readable:
                        try:
                            chunk = sock.recv(262144)
                        except BlockingIOError:
                            continue
                        except ConnectionResetError:
                            chunk = b""
                        if not chunk:
                            return frames, False, exec_id
                        frames.collect(chunk)
        finally:
            sock.close()
            stream.close()

    def _agent(self, cid: str, op: str, args: Mapping[str, Any], stdin: bytes | None = None) -> Any:
        """Run one `_AGENT` operation; returns its JSON result (or raw stdout for 'read')."""
        frames, timed_out, exec_id = self._exec_raw(
            cid,
            [*_PYTHON, op, json.dumps(args)],
            env=["SANDPIT_INTERNAL=1", f"SANDPIT_CODE={_AGENT}"],
            stdin=stdin,
        )
        if timed_out:
            raise ProviderError(f"Sandbox helper '{op}' did not answer.")
        err = bytes(frames.err)
        mark = err.rfind(_ERROR_MARK)
        if mark >= 0:
            data = json.loads(err[mark + len(_ERROR_MARK) :])
            raise _ERRORS.get(data["code"], ProviderError)(data["message"])
        out = bytes(frames.out)
        if err:
            self._raise_helper_failure(cid, exec_id, op, err)
        if op == "read":
            head, _, body = out.partition(b"\n")
            if not head.isdigit() or int(head) != len(body):
                self._raise_helper_failure(cid, exec_id, op, err)
            return body
        if not out:
            self._raise_helper_failure(cid, exec_id, op, err)
        return json.loads(out)

    def _raise_helper_failure(self, cid: str, exec_id: str, op: str, err: bytes) -> None:
        with _translate(cid):
            code = self._api().exec_inspect(exec_id).get("ExitCode")
        text = err.decode("utf-8", "replace").strip()[-500:]
        if code == 137 or "Cannot allocate memory" in text or "Resource temporarily" in text:
            raise ResourceExhausted(f"The sandbox is out of memory or processes ({op}).")
        raise ProviderError(f"Sandbox helper '{op}' failed (exit {code}): {text}")

    def _kill_tag(self, cid: str, tag: str) -> None:
        self._agent(cid, "killtag", {"tag": tag})

    # -- lifecycle -----------------------------------------------------------

    def create(self, spec: SandboxSpec) -> SandboxHandle:
        """Create and start a container; returns once it can take execs."""
        res = spec.resources
        labels = {str(k): str(v) for k, v in spec.labels.items()}
        labels.update(
            {
                self._label("sandbox_id"): spec.sandbox_id,
                self._label("installation"): self.installation,
                self._label("managed"): "1",
                self._label("template"): spec.template,
            }
        )
        if not _SANDBOX_ID.fullmatch(spec.sandbox_id):
            raise InvalidRequest("sandbox_id must be 1-64 letters, digits, '-' or '_'.")
        runtime = self._runtime_for(spec)
        labels[self._label("isolation")] = isolation_of(runtime)
        # HOME is the workspace, as in the local provider.
        env = ["HOME=/workspace", *_check_env(spec.env)]
        name = f"{self.label_prefix}-{self.installation}-{spec.sandbox_id}"
        disk_bytes = res.disk_mb * 1024 * 1024
        api = self._api()
        with _translate():
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
                },
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
                    self.image,
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
        cid = created["Id"]
        try:
            with _translate(cid):
                api.start(cid)
        except BaseException:
            with _translate():
                try:
                    api.remove_container(cid, force=True)
                except docker.errors.NotFound:
                    pass
            raise
        self._owned.add(cid)
        return self._handle(cid, "running", datetime.now(UTC), labels)

    def get(self, provider_id: str) -> SandboxHandle:
        """Raises SandboxGone when it does not exist (or belongs to another installation)."""
        info = self._inspect(provider_id)
        labels = info["Config"].get("Labels") or {}
        if not self._is_ours(labels):
            raise SandboxGone(f"Sandbox {provider_id} does not exist.")
        return self._handle(
            info["Id"], info["State"]["Status"], _parse_time(info["Created"]), labels
        )

    def list(self) -> list[SandboxHandle]:
        """Every container labelled for this installation, running or not (orphans included)."""
        with _translate():
            rows = self._api().containers(
                all=True,
                filters={
                    "label": [
                        f"{self._label('managed')}=1",
                        f"{self._label('installation')}={self.installation}",
                    ]
                },
            )
        return [
            self._handle(
                row["Id"],
                row["State"],
                datetime.fromtimestamp(row["Created"], UTC),
                row["Labels"] or {},
            )
            for row in rows
        ]

    def destroy(self, provider_id: str) -> bool:
        """Remove the container and its tmpfs data. False when it was already gone."""
        try:
            self._cid(provider_id)
        except SandboxGone:
            return False
        with _translate(provider_id):
            try:
                self._api().remove_container(provider_id, force=True, v=True)
            except docker.errors.NotFound:
                return False
            except docker.errors.APIError as exc:
                if exc.status_code == 409 and "already in progress" in str(exc.explanation):
                    return False
                raise
            finally:
                self._owned.discard(provider_id)
                self._cpu_samples.pop(provider_id, None)
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
        with _translate(cid):
            info = api.inspect_container(cid)
            if not info["State"]["Running"]:
                raise SandboxGone(f"Sandbox {provider_id} is not running.")
            raw = api.stats(cid, stream=False, one_shot=True)
        frames, _, _ = self._exec_raw(
            cid, ["du", "-s", "-B1", WORKSPACE], env=["SANDPIT_INTERNAL=1"]
        )
        try:
            disk = int(bytes(frames.out).split()[0])
        except (IndexError, ValueError):
            disk = 0
        started = _parse_time(info["State"]["StartedAt"])
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
        """Ping the engine. Raises ProviderUnavailable when it does not answer."""
        started = time.perf_counter()
        with _translate():
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
        """Run one command to completion under the in-container wrapper (see module doc)."""
        if request.args is None:
            argv = ["sh", "-c", request.command]
        else:
            argv = [request.command, *request.args]
        return self._run(provider_id, argv, request)

    def _run(
        self,
        provider_id: str,
        argv: list[str],
        request: ExecRequest,
        code: bytes | None = None,
        code_suffix: str = "",
    ) -> ExecResult:
        if request.timeout_s <= 0:
            raise InvalidRequest("timeout_s must be positive.")
        if request.max_output_bytes < 0:
            raise InvalidRequest("max_output_bytes must not be negative.")
        if request.cwd is not None:
            _check_path(request.cwd)
        if any("\x00" in a for a in argv):
            raise InvalidRequest("Command arguments cannot contain NUL bytes.")
        env = _check_env(request.env)
        cid = self._cid(provider_id)
        nonce = secrets.token_hex(8)
        stdin = request.stdin
        code_len = ""
        if code is not None:
            code_len = str(len(code))
            stdin = code + (request.stdin or b"")
        cap = request.max_output_bytes
        wrapper = [
            _RUNNER,
            nonce,
            repr(float(request.timeout_s)),
            str(cap),
            request.cwd or "",
            "1" if request.stdin is not None else "0",
            code_len,
            code_suffix,
            *argv,
        ]
        started = time.perf_counter()
        frames, transport_timeout, exec_id = self._exec_raw(
            cid,
            wrapper,
            env=[*env, "SANDPIT_INTERNAL=1"],
            stdin=stdin,
            timeout_s=request.timeout_s + _TRANSPORT_GRACE_S,
            caps=(cap, cap + 65536),
        )
        duration_ms = (time.perf_counter() - started) * 1000.0
        err = bytes(frames.err)
        mark = err.rfind(b"\x00" + nonce.encode() + b":")
        if mark >= 0:
            status = err[mark + len(nonce) + 2 :].decode("utf-8", "replace").rstrip("\n")
            if status.startswith("E "):
                code_name, _, message = status[2:].partition(" ")
                raise _ERRORS.get(code_name, ProviderError)(message)
            fields = status.split()
            return ExecResult(
                stdout=bytes(frames.out),
                stderr=err[:mark],
                exit_code=int(fields[1]),
                duration_ms=float(fields[6]),
                timed_out=fields[2] == "1",
                stdout_truncated=fields[3] == "1" or frames.out_truncated,
                stderr_truncated=fields[4] == "1",
                cpu_time_ms=float(fields[7]),
                peak_memory_bytes=int(fields[8]),
                oom_killed=fields[5] == "1",
            )
        # No trailer: the wrapper itself died (OOM killer, pids limit) or hung.
        if transport_timeout:
            # A sandbox that died meanwhile is judged by its state below.
            with suppress(SandboxGone):
                self._kill_tag(cid, f"SANDPIT_EXEC={nonce}")
        container = self._inspect(cid)
        if not container["State"].get("Running"):
            labels = container["Config"].get("Labels") or {}
            if labels.get(self._label("isolation")) == GVISOR:
                # gVisor's kernel is one set of host processes: the host's OOM killer or
                # pids limit ends all of it, not the one process that overran.
                raise ResourceExhausted(
                    f"Sandbox {provider_id} stopped: under gVisor, running out of memory or "
                    "processes ends the whole sandbox."
                )
            raise SandboxGone(f"Sandbox {provider_id} stopped while running the command.")
        with _translate(cid):
            info = self._api().exec_inspect(exec_id)
        exit_code = info.get("ExitCode")
        if exit_code in (126, 127) and _RUNNER.encode() in bytes(frames.out) + err:
            raise ProviderUnavailable(
                f"The sandbox image has no {_RUNNER}: it predates this Sandpit. "
                "Rebuild it with scripts/build-sandbox-image.sh."
            )
        if transport_timeout or exit_code is None:
            exit_code = -9
        elif exit_code > 128:
            exit_code = -(exit_code - 128)
        return ExecResult(
            stdout=bytes(frames.out[:cap]),
            stderr=err[:cap],
            exit_code=exit_code,
            duration_ms=duration_ms,
            timed_out=transport_timeout,
            stdout_truncated=frames.out_truncated,
            stderr_truncated=len(err) > cap,
            oom_killed=exit_code == -9 and not transport_timeout,
        )

    def run_code(
        self,
        provider_id: str,
        code: str,
        language: str,
        timeout_s: float = 30.0,
        stdin: bytes | None = None,
    ) -> ExecResult:
        """language is 'python', 'node' or 'bash'; anything else is InvalidRequest."""
        if language not in _LANGUAGES:
            raise InvalidRequest(
                f"Unsupported language {language!r}; expected one of {', '.join(_LANGUAGES)}."
            )
        request = ExecRequest(command=language, timeout_s=timeout_s, stdin=stdin)
        encoded = code.encode()
        if len(encoded) <= _INLINE_CODE_MAX and "\x00" not in code:
            argv = [code if a == "{code}" else a for a in _LANGUAGES[language][0]]
            return self._run(provider_id, argv, request)
        return self._run(
            provider_id,
            list(_LANGUAGE_FILE_ARGV[language]),
            request,
            code=encoded,
            code_suffix=_LANGUAGES[language][1],
        )

    # -- files -------------------------------------------------------------------

    def read_file(
        self, provider_id: str, path: str, offset: int = 0, length: int | None = None
    ) -> bytes:
        _check_path(path)
        if offset < 0 or (length is not None and length < 0):
            raise InvalidRequest("offset and length must not be negative.")
        args = {"path": path, "offset": offset, "length": length, "max": self.max_file_bytes}
        return self._agent(self._cid(provider_id), "read", args)  # type: ignore[no-any-return]

    def write_file(self, provider_id: str, path: str, data: bytes) -> FileEntry:
        """Creates parent directories; FileTooLarge beyond `max_file_bytes`."""
        _check_path(path)
        if len(data) > self.max_file_bytes:
            raise FileTooLarge(f"{len(data)} bytes is over the {self.max_file_bytes}-byte limit.")
        cid = self._cid(provider_id)
        return _entry(
            self._agent(cid, "write", {"path": path, "size": len(data)}, stdin=bytes(data))
        )

    def mkdir(self, provider_id: str, path: str) -> FileEntry:
        _check_path(path)
        return _entry(self._agent(self._cid(provider_id), "mkdir", {"path": path}))

    def list_files(self, provider_id: str, path: str, recursive: bool = False) -> list[FileEntry]:
        _check_path(path)
        rows = self._agent(self._cid(provider_id), "list", {"path": path, "recursive": recursive})
        return [_entry(row) for row in rows]

    def stat(self, provider_id: str, path: str) -> FileEntry:
        _check_path(path)
        return _entry(self._agent(self._cid(provider_id), "stat", {"path": path}))

    def exists(self, provider_id: str, path: str) -> bool:
        _check_path(path)
        return bool(self._agent(self._cid(provider_id), "exists", {"path": path}))

    def remove(self, provider_id: str, path: str, recursive: bool = False) -> None:
        _check_path(path)
        self._agent(self._cid(provider_id), "remove", {"path": path, "recursive": recursive})

    def move(self, provider_id: str, src: str, dst: str) -> FileEntry:
        _check_path(src)
        _check_path(dst)
        return _entry(self._agent(self._cid(provider_id), "move", {"src": src, "dst": dst}))

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
        _check_env(env or {})
        argv = ["sh", "-c", command] if args is None else [command, *args]
        shown = command if args is None else " ".join([command, *args])
        payload = {"argv": argv, "command": shown, "cwd": cwd, "env": dict(env or {})}
        return _process(self._agent(self._cid(provider_id), "spawn", payload))

    def list_processes(self, provider_id: str) -> list[ProcessInfo]:
        """Live processes (excluding init and Sandpit's own helpers) and exited background ones."""
        return [_process(row) for row in self._agent(self._cid(provider_id), "ps", {})]

    def signal_process(self, provider_id: str, pid: int, signal: int) -> None:
        """Signal a process (its whole group when it is one we started)."""
        self._agent(self._cid(provider_id), "kill", {"pid": int(pid), "signal": int(signal)})

    # -- real-time ---------------------------------------------------------------------

    def open_pty(
        self,
        provider_id: str,
        cols: int = 80,
        rows: int = 24,
        shell: str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> DockerPtySession:
        """A TTY exec running `shell` (bash by default) in the workspace."""
        if cwd is not None:
            _check_path(cwd)
        cid = self._cid(provider_id)
        tag = secrets.token_hex(8)
        environment = [
            "TERM=xterm-256color",
            *_check_env(env or {}),
            f"SANDPIT_SESSION={tag}",
        ]
        workdir = WORKSPACE
        if cwd:
            workdir = cwd if cwd.startswith("/") else f"{WORKSPACE}/{cwd}"
        api = self._api()
        with _translate(cid):
            exec_id = api.exec_create(
                cid,
                [shell or "/bin/bash"],
                stdin=True,
                tty=True,
                environment=environment,
                workdir=workdir,
                detach_keys=_DETACH_KEYS,
            )["Id"]
            stream = api.exec_start(exec_id, socket=True, tty=True)
        session = DockerPtySession(self, cid, exec_id, stream, f"SANDPIT_SESSION={tag}")
        try:
            session.resize(cols, rows)
        except ProviderError:
            pass
        return session

    def open_ports(self, provider_id: str) -> list[OpenPort]:
        rows = self._agent(self._cid(provider_id), "ports", {})
        return [OpenPort(port=int(r["port"]), address=r["address"]) for r in rows]

    def connect_port(self, provider_id: str, port: int) -> DockerPortStream:
        """Bytes to 127.0.0.1:port through a relay exec (works with network none).

        Raises InvalidRequest when nothing listens there.
        """
        if not 0 < int(port) < 65536:
            raise InvalidRequest(f"Invalid port {port!r}.")
        cid = self._cid(provider_id)
        api = self._api()
        with _translate(cid):
            exec_id = api.exec_create(
                cid,
                [*_PYTHON, str(int(port))],
                stdin=True,
                environment=["SANDPIT_INTERNAL=1", f"SANDPIT_CODE={_PORT_RELAY}"],
            )["Id"]
            stream = api.exec_start(exec_id, socket=True)
        port_stream = DockerPortStream(stream)
        greeting = port_stream.greet(timeout_s=15.0)
        if greeting.strip() != b"SANDPIT-PORT-OK":
            port_stream.close()
            if b"SANDPIT-PORT-ERR" in greeting:
                raise InvalidRequest(f"Nothing is listening on port {port} in the sandbox.")
            raise ProviderError(f"Could not open a stream to port {port}: {greeting!r}")
        return port_stream

    def watch(self, provider_id: str, path: str, recursive: bool = True) -> DockerWatch:
        """Batches of file events under `path`; the watch is armed when this returns."""
        _check_path(path)
        cid = self._cid(provider_id)
        target = self._agent(cid, "stat", {"path": path})
        if target["type"] != "dir":
            raise FileConflict(f"Not a directory: {path}")
        real = f"{WORKSPACE}/{target['path']}" if target["path"] else WORKSPACE
        tag = secrets.token_hex(8)
        cmd = ["inotifywait", "-m", "--format", "%e %w%f%0", "--no-newline", "-e", _WATCH_EVENTS]
        if recursive:
            cmd.append("-r")
        cmd.append(real)
        api = self._api()
        with _translate(cid):
            exec_id = api.exec_create(
                cid, cmd, environment=["SANDPIT_INTERNAL=1", f"SANDPIT_SESSION={tag}"]
            )["Id"]
            stream = api.exec_start(exec_id, socket=True)
        sock = _raw_socket(stream)
        frames = _Frames((1 << 62, 1 << 62))
        deadline = time.monotonic() + 15.0
        try:
            while b"Watches established" not in frames.err:
                remaining = deadline - time.monotonic()
                ready, _, _ = select.select([sock], [], [], max(remaining, 0))
                chunk = sock.recv(65536) if ready else b""
                if not chunk:
                    raise ProviderError(
                        "Could not start the file watcher: "
                        + bytes(frames.err).decode("utf-8", "replace")[-300:]
                    )
                frames.collect(chunk)
        except BaseException:
            sock.close()
            stream.close()
            self._kill_tag(cid, f"SANDPIT_SESSION={tag}")
            raise
        return DockerWatch(self, cid, stream, frames, f"SANDPIT_SESSION={tag}")


def _file_events(raw: list[tuple[str, str]]) -> list[FileEvent]:
    """inotifywait records -> FileEvents, pairing moves and dropping duplicates."""
    events: list[FileEvent] = []
    seen: set[tuple[str, str]] = set()
    moved_from: tuple[str, bool] | None = None

    def rel(full: str) -> str:
        return full[len(WORKSPACE) + 1 :] if full.startswith(WORKSPACE + "/") else ""

    def add(event: FileEvent) -> None:
        key = (event.type, event.path)
        if event.type in ("created", "modified") and key in seen:
            return
        seen.add(key)
        events.append(event)

    for kinds, full in raw:
        flags = set(kinds.split(","))
        is_dir = "ISDIR" in flags
        path = rel(full)
        if moved_from is not None and "MOVED_TO" not in flags:
            add(FileEvent("deleted", moved_from[0], is_dir=moved_from[1]))
            moved_from = None
        if "MOVED_FROM" in flags:
            moved_from = (path, is_dir)
        elif "MOVED_TO" in flags:
            if moved_from is not None:
                add(FileEvent("moved", path, is_dir=is_dir, old_path=moved_from[0]))
                moved_from = None
            else:
                add(FileEvent("created", path, is_dir=is_dir))
        elif "CREATE" in flags:
            add(FileEvent("created", path, is_dir=is_dir))
        elif "DELETE" in flags:
            add(FileEvent("deleted", path, is_dir=is_dir))
        elif "MODIFY" in flags or "CLOSE_WRITE" in flags:
            if not is_dir:
                add(FileEvent("modified", path))
    if moved_from is not None:
        add(FileEvent("deleted", moved_from[0], is_dir=moved_from[1]))
    return events
