"""Start a real Sandpit server (daphne) for benchmarks, on Postgres + Redis when available."""

from __future__ import annotations

import ctypes
import http.client
import json
import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable

LAUNCHERS: dict[int, int] = {}
"""The pid of the launcher serving each port `daphne()` started, while it runs."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {
        **os.environ,
        "DATABASE_URL": os.environ.get(
            "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/sandpit_bench"
        ),
        "REDIS_URL": os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/13"),
        "SANDPIT_PROVIDERS": os.environ.get("SANDPIT_PROVIDERS", "local"),
        "SANDPIT_MAX_CONCURRENT_SANDBOXES": "200",
        "SANDPIT_API_RATE": "1000000/min",
        "SANDPIT_LOG_LEVEL": "WARNING",
        "DJANGO_DEBUG": "false",
    }
    env.update(extra or {})
    return env


def ensure_database(env: dict[str, str]) -> None:
    url = env["DATABASE_URL"]
    name = url.rsplit("/", 1)[-1]
    subprocess.run(
        ["psql", "-h", "127.0.0.1", "-U", "postgres", "-qc", f"CREATE DATABASE {name}"],
        capture_output=True,
    )
    subprocess.run([PY, "manage.py", "migrate", "--noinput", "-v0"], cwd=ROOT, env=env, check=True)
    if url.startswith("postgres"):
        # Every sandbox's life (creating, running, destroyed) leaves dead row versions that
        # a create's admission count reads until a vacuum removes them. PostgreSQL's
        # autovacuum does that by default; this machine's server runs with it off, and the
        # bench database's dead rows of earlier runs made the count's statement 0.85 ms
        # instead of 0.40 here, dearer with every run. Vacuum as autovacuum would have.
        subprocess.run(
            ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", name, "-qc", "VACUUM ANALYZE"],
            capture_output=True,
        )


def create_org_and_key(env: dict[str, str], slug: str = "bench") -> str:
    code = (
        "from accounts.models import Organization;"
        "from accounts.services import api_key_create;"
        f"org,_=Organization.objects.get_or_create(slug='{slug}',defaults={{'name':'Bench','plan':'premium'}});"
        "org.plan='premium';org.save();"
        # A run that crashed left its sandboxes' rows live (their servers and jails are
        # gone), and they would count against the organization's limit in this run.
        "from sandboxes.models import Sandbox;"
        "Sandbox.objects.filter(organization=org).exclude(state='destroyed')"
        ".update(state='destroyed',destroy_reason='bench');"
        "print(api_key_create(organization=org,name='bench').secret)"
    )
    out = subprocess.run(
        [PY, "manage.py", "shell", "-c", code],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip().splitlines()[-1]


@contextmanager
def daphne(
    env: dict[str, str],
    app: str = "playground.asgi:application",
    processes: int = 1,
    root: Path = ROOT,
    mounts_apart: bool = False,
):
    """A server on a free port, started by the product's launcher (playground/webserver.py).
    `app` may name a module under bench/ (e.g. the bench's own `_bench_asgi:application`,
    which adds a bare endpoint to the product's). With `processes` > 1, the launcher runs
    that many on the port (playground/webprocs.py). `root` serves another checkout of the project (e.g. a git
    worktree of an earlier commit) with this interpreter, for before/after in one run.
    `mounts_apart` (as root): the server in a private mount namespace of its own (util-linux
    `unshare`, which execs it), so that two servers side by side do not see each other's
    sandbox volumes, as two hosts would not."""
    port = free_port()
    env = {
        **env,
        # The checkout first: the project is also installed (editable) from this one.
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(root / "bench"), str(root), env.get("PYTHONPATH")])
        ),
    }
    # The product's launcher (make run's): daphne with its body ceiling, uvloop and the
    # warm pools started before the first request.
    server = [PY, "-m", "playground.webserver", "--processes", str(processes)]
    if mounts_apart and os.geteuid() == 0:
        server = ["unshare", "--mount", "--propagation", "private", *server]
    proc = subprocess.Popen(
        [
            *server,
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            app,
        ],
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60  # a loaded 2-core machine starts daphne slowly
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
        except OSError:
            time.sleep(0.1)
    LAUNCHERS[port] = proc.pid
    try:
        yield port
    finally:
        LAUNCHERS.pop(port, None)
        proc.terminate()
        proc.wait(10)


class Api:
    """A keep-alive HTTP client for one server."""

    def __init__(self, port: int, key: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port)
        self.headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    def call(self, method: str, path: str, body: object | None = None) -> tuple[int, object]:
        data = json.dumps(body).encode() if body is not None else None
        self.conn.request(method, path, body=data, headers=self.headers)
        response = self.conn.getresponse()
        raw = response.read()
        try:
            return response.status, json.loads(raw) if raw else None
        except ValueError:
            return response.status, raw


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds `pid` has used so far (0 once it is gone)."""
    return sum(process_user_and_system_cpu_s(pid))


def process_user_and_system_cpu_s(pid: int) -> tuple[float, float]:
    """User and system CPU seconds `pid` has used so far ((0, 0) once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / ticks, int(fields[12]) / ticks


def process_context_switches(pid: int) -> tuple[int, int]:
    """Voluntary and involuntary context switches of `pid`'s threads so far (threads that
    have ended are not counted; (0, 0) once it is gone)."""
    voluntary = involuntary = 0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return 0, 0
    for task in tasks:
        try:
            status = (task / "status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            name, _, value = line.partition(":")
            if name == "voluntary_ctxt_switches":
                voluntary += int(value)
            elif name == "nonvoluntary_ctxt_switches":
                involuntary += int(value)
    return voluntary, involuntary


def web_processes(port: int) -> list[int]:
    """The web server processes serving `port`: the launcher (which is the server itself
    when it runs one process) and the Python servers it started; not the jails below them."""
    launcher = LAUNCHERS[port]
    found = [launcher]
    for task in Path(f"/proc/{launcher}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                command = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"playground.webserver" in command:  # its children (playground/webprocs.py)
                found.append(int(child))
    return found


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[index]


_CLONE_NEWNS = 0x00020000
_MS_REC = 0x4000
_MS_PRIVATE = 1 << 18
_MNT_DETACH = 0x2
VOLUME_SOURCE = "sandpit"
"""The source name of every local sandbox's tmpfs (sandboxes/providers/local/volume.py)."""


def leftovers() -> str | None:
    """What earlier servers left on this machine, said before a benchmark's servers start:
    their live jails (a local sandbox outlives the server that made it) and their sandboxes'
    volumes in this mount namespace. Each volume is a mount every later jail's start sees
    (jail_launch detaches them one by one, ~15 µs each here), so a run after servers that
    were killed with hundreds of sandboxes is not a clean machine's: here 563 volumes left behind
    made a first burst of 100 4.2x its floor instead of 2.5x. None when there are none."""
    jails = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            jails += b"/opt/sandpit/agent.pyz" in command and b"-c\0" in command
    with open("/proc/self/mountinfo") as table:
        volumes = sum(line.partition(" - ")[2].split()[1:2] == [VOLUME_SOURCE] for line in table)
    if not (jails or volumes):
        return None
    return (
        f"warning: {jails} live jails and {volumes} sandbox volumes on this machine before "
        "the servers started, left by earlier servers: every jail's start is dearer beside "
        "them, so these figures are not a clean machine's (destroy those sandboxes first)"
    )


def floors_apart() -> int:
    """Run this thread's later subprocesses (the raw floors) in a private mount namespace
    without the sandboxes' volumes, now and later: each volume is a mount on the host, and
    bwrap copies and re-reads the whole mount table, so a raw spawn measured beside the
    server's live sandboxes would be dearer than on a host without them. Call it from the
    thread that spawns the floors, after the server started (it stays in the host's
    namespace). Returns how many volumes were detached; -1 when not root (floors as they are)."""
    if os.geteuid() != 0:
        return -1
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    if libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
    detached = 0
    with open("/proc/self/mountinfo") as table:
        lines = table.read().splitlines()
    for line in reversed(lines):
        fields, _, tail = line.partition(" - ")
        if tail.split()[1:2] == [VOLUME_SOURCE]:
            point = fields.split()[4].replace("\\040", " ")
            detached += libc.umount2(os.fsencode(point), _MNT_DETACH) == 0
    return detached
