"""Terminal benchmarks: keystroke echo latency, output throughput, open-to-prompt, load.

Compares, in one run on this machine:
  * a raw local PTY (pty.fork + write/read) - the floor;
  * Sandpit: WebSocket -> daphne -> TerminalConsumer -> the sandbox agent's PTY (local, and
    docker with --docker), the path a browser uses;
  * Jupyter Server's terminals (terminado's JSON ["stdin", ...] protocol over its WebSocket);
  * floors for each part of Sandpit's path: the agent hop alone (this process typing into a
    Sandpit terminal through the link a web process uses, no WebSocket), and WebSocket
    servers with no terminal - bare autobahn on Twisted's asyncio reactor (what daphne
    serves WebSockets with), daphne with a bare ASGI echo app, tornado (what Jupyter uses) -
    and daphne bridging a PTY it holds itself (its floor for a terminal, output too).

Echo is measured side by side: every system's blocks of round trips alternate, so a noisy
machine weighs on all alike; throughput alternates too (median of 3). Each server's CPU per
round trip (its own threads, and its children: agents and shells) is read from schedstat;
on a shared machine it is steadier than latency. With --load N, N Sandpit and N Jupyter
terminals stream output at once (each ~20 KB/s, read by client processes of their own)
while one more of each measures echo, side by side; the CPU each server spent per MB
streamed is reported with it.

Run:  .venv/bin/python bench/bench_terminal.py [--rounds 500] [--mb 50] [--idle 100] [--docker]
                                              [--load 50] [--opens 10]
It uses a throwaway SQLite database and var directory (no Redis: in-memory channel layer),
starts Sandpit's web server (python -m playground.webserver), jupyter_server and the floor
servers on free loopback ports and stops them at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pty
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import httpx
import websockets

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from sandboxes.agent_sessions import SessionLink, session_attach, session_list  # noqa: E402

BIN = Path(sys.executable).parent
ECHO_CMD = "stty -echoctl; cat > /dev/null\r"
LOAD_CMD = "while :; do printf '%02000d\\n' 0; read -rst 0.1 _; done\r"
"""What each loaded terminal runs: 2 KB every 100 ms, like a chatty build log, with shell
builtins only (a `sleep` a tick would fork thousands of processes a second over 100
terminals, and measure the machine's fork rate instead)."""
PROMPTS = (b"$ ", b"# ")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def percentiles(samples_ms: list[float]) -> dict[str, float]:
    ordered = sorted(samples_ms)
    return {
        "p50_ms": round(statistics.median(ordered), 3),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 3),
        "mean_ms": round(statistics.fmean(ordered), 3),
    }


def cpu_ns(pid: int) -> int:
    """CPU time of every thread of `pid` so far, in ns (schedstat: no clock-tick rounding)."""
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return total


def descendants(pid: int) -> list[int]:
    """Every live process under `pid` (for a server: its sandboxes' agents and shells)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _tree_cpu_ns(pid: int) -> tuple[int, int]:
    """(the process's own CPU, its descendants' CPU), in ns."""
    return cpu_ns(pid), sum(cpu_ns(child) for child in descendants(pid))


# --- raw PTY floor ------------------------------------------------------------------------------


def raw_pty_throughput(total: int) -> float:
    pid, fd = pty.fork()
    if pid == 0:
        os.execvp("sh", ["sh", "-c", f"yes | head -c {total}"])
    received = 0
    start = time.perf_counter()
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:
            break
        if not data:
            break
        received += len(data)
    elapsed = time.perf_counter() - start
    os.waitpid(pid, 0)
    os.close(fd)
    return received / elapsed / 1e6


# --- Sandpit through daphne --------------------------------------------------------------------


class Sandpit:
    def __init__(self, workdir: Path, providers: str) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.env = {
            **{k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")},
            "DJANGO_SETTINGS_MODULE": "playground.settings",
            "SANDPIT_VAR_DIR": str(workdir),
            "SANDPIT_SQLITE_PATH": str(workdir / "db.sqlite3"),
            "SANDPIT_LOCAL_ROOT": str(workdir / "sandboxes"),
            "SANDPIT_PROVIDERS": providers,
            "SANDPIT_DEFAULT_PROVIDER": "local",
            "SANDPIT_MAX_TERMINALS_PER_SANDBOX": "20",
            "SANDPIT_LOG_LEVEL": "WARNING",
            "PYTHONPATH": str(ROOT),
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.key = ""

    def setup(self) -> None:
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=self.env, check=True
        )
        script = (
            "from accounts.models import Organization, User, Membership;"
            "from accounts.services import api_key_create;"
            "u = User.objects.create_user(email='bench@example.com', password='x');"
            "o = Organization.objects.create(name='Bench', slug='bench', plan='premium',"
            " max_concurrent_sandboxes=50);"
            "Membership.objects.create(user=u, organization=o, role='owner');"
            "print(api_key_create(organization=o, name='bench', created_by=u).secret)"
        )
        out = subprocess.run(
            [sys.executable, "manage.py", "shell", "-c", script],
            cwd=ROOT,
            env=self.env,
            check=True,
            capture_output=True,
            text=True,
        )
        self.key = out.stdout.strip().splitlines()[-1]
        self.log = open(self.workdir / "daphne.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "playground.webserver",  # what `make run` serves with: daphne + body ceiling
                "-b",
                "127.0.0.1",
                "-p",
                str(self.port),
                "playground.asgi:application",
            ],
            cwd=ROOT,
            env=self.env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.base}/health/live", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        self.http = httpx.Client(
            base_url=self.base, headers={"Authorization": f"Bearer {self.key}"}, timeout=60
        )

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def sandbox(self, provider: str = "local") -> str:
        response = self.http.post("/api/v1/sandboxes", json={"provider": provider})
        response.raise_for_status()
        return response.json()["id"]

    def terminal(self, sandbox_id: str) -> str:
        response = self.http.post(f"/api/v1/sandboxes/{sandbox_id}/terminals", json={})
        response.raise_for_status()
        return response.json()["ws_path"]

    async def connect(self, path: str) -> websockets.ClientConnection:
        return await websockets.connect(
            f"ws://127.0.0.1:{self.port}{path}",
            origin=self.base,  # type: ignore[arg-type]
            additional_headers={"Authorization": f"Bearer {self.key}"},
            max_size=None,
            compression=None,
        )

    def rss_kb(self) -> int:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)


async def _drain_until(
    ws: websockets.ClientConnection, marker: bytes, limit_s: float = 10
) -> bytes:
    data = b""
    deadline = time.monotonic() + limit_s
    while marker not in data:
        frame = await asyncio.wait_for(ws.recv(), deadline - time.monotonic())
        if isinstance(frame, bytes):
            data += frame
    return data


async def sandpit_throughput(sp: Sandpit, path: str, total: int) -> float:
    return await ws_throughput(await sp.connect(path), total)


async def ws_throughput(ws: websockets.ClientConnection, total: int) -> float:
    """MB/s of `yes | head -c total` through a terminal socket of raw bytes both ways."""
    await _drain_any(ws, PROMPTS)
    await ws.send(f"yes | head -c {total}; echo; echo END-$((2+3))\r".encode())
    await _drain_until(ws, b"\n")  # the echoed command line
    received = 0
    start = time.perf_counter()
    tail = b""
    while b"END-5" not in tail:
        frame = await ws.recv()
        if isinstance(frame, bytes):
            received += len(frame)
            tail = (tail + frame)[-64:]
    elapsed = time.perf_counter() - start
    await ws.close()
    return received / elapsed / 1e6


async def sandpit_idle(sp: Sandpit, count: int, provider: str) -> dict[str, float]:
    before = sp.rss_kb()
    sockets = []
    errors = 0
    per_sandbox = 10
    for _ in range(0, count, per_sandbox):
        sandbox_id = sp.sandbox(provider)
        for _ in range(per_sandbox):
            try:
                ws = await sp.connect(sp.terminal(sandbox_id))
                sockets.append(ws)
            except Exception:  # noqa: BLE001 - counted
                errors += 1
    await asyncio.sleep(2)
    for ws in sockets:
        try:
            await _drain_until(ws, b"$ ", limit_s=10)
            await ws.send(b"echo ok\r")
            await _drain_until(ws, b"ok", limit_s=10)
        except Exception:  # noqa: BLE001 - counted
            errors += 1
    after = sp.rss_kb()
    listed = sum(
        len(sp.http.get(f"/api/v1/sandboxes/{s['id']}/terminals").json()["results"])
        for s in sp.http.get("/api/v1/sandboxes").json()["results"]
    )
    for ws in sockets:
        await ws.close()
    return {
        "terminals": len(sockets),
        "listed": listed,
        "errors": errors,
        "daphne_rss_before_mb": round(before / 1024, 1),
        "daphne_rss_after_mb": round(after / 1024, 1),
        "daphne_rss_per_terminal_kb": round((after - before) / max(1, len(sockets)), 1),
    }


async def _drain_any(ws: websockets.ClientConnection, markers: tuple[bytes, ...]) -> None:
    data = b""
    deadline = time.monotonic() + 30
    while not any(m in data for m in markers):
        frame = await asyncio.wait_for(ws.recv(), deadline - time.monotonic())
        if isinstance(frame, bytes):
            data += frame


async def sandpit_open_to_prompt(sp: Sandpit, sandbox_id: str, count: int) -> dict[str, float]:
    """POST a terminal, connect its socket, wait for the first prompt; then DELETE it."""
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        path = sp.terminal(sandbox_id)
        ws = await sp.connect(path)
        await _drain_any(ws, PROMPTS)
        samples.append((time.perf_counter() - start) * 1000)
        await ws.close()
        sp.http.delete(f"/api/v1/sandboxes/{sandbox_id}/terminals/{path.rsplit('/', 1)[-1]}")
    return percentiles(samples)


async def _load_client(spec: dict[str, object]) -> None:
    """(In its own process.) Connect to every URL, start LOAD_CMD, read until stdin closes."""
    sockets = []
    for url in spec["urls"]:  # type: ignore[attr-defined]
        ws = await websockets.connect(
            url,
            origin=spec.get("origin"),  # type: ignore[arg-type]
            additional_headers=spec.get("headers") or {},  # type: ignore[arg-type]
            max_size=None,
            compression=None,
        )
        sockets.append(ws)
    for ws in sockets:
        if spec["kind"] == "jupyter":
            await ws.send(json.dumps(["stdin", LOAD_CMD]))
        else:
            await ws.send(LOAD_CMD.encode())
    received = [0]

    async def drain(ws: websockets.ClientConnection) -> None:
        async for frame in ws:
            received[0] += len(frame)

    tasks = [asyncio.ensure_future(drain(ws)) for ws in sockets]
    print("LOADED", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    for task in tasks:
        task.cancel()
    print(json.dumps({"received_mb": round(received[0] / 1e6, 1)}), flush=True)


async def start_load(spec: dict[str, object]) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--load-client",
        json.dumps(spec),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 120)
    if b"LOADED" not in line:
        raise RuntimeError(f"load client failed: {line!r}")
    await asyncio.sleep(1.0)  # let the output start everywhere
    return proc


async def stop_load(proc: asyncio.subprocess.Process) -> str:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.close()
    out = await asyncio.wait_for(proc.stdout.read(), 60)
    await proc.wait()
    return out.decode().strip()


# --- Jupyter Server terminals ------------------------------------------------------------------


class Jupyter:
    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.workdir = workdir

    def start(self) -> None:
        self.log = open(self.workdir / "jupyter.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                str(BIN / "jupyter-server"),
                "--no-browser",
                f"--port={self.port}",
                "--ip=127.0.0.1",
                f"--IdentityProvider.token={self.token}",
                f"--ServerApp.root_dir={self.workdir}",
                "--ServerApp.allow_root=True",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if (
                    httpx.get(
                        f"http://127.0.0.1:{self.port}/api/status?token={self.token}", timeout=1
                    ).status_code
                    == 200
                ):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError("jupyter_server did not start")

    def terminal(self) -> str:
        response = httpx.post(
            f"http://127.0.0.1:{self.port}/api/terminals",
            headers={"Authorization": f"token {self.token}"},
            timeout=30,
        )
        response.raise_for_status()
        return response.json()["name"]

    async def connect(self, name: str) -> websockets.ClientConnection:
        return await websockets.connect(
            f"ws://127.0.0.1:{self.port}/terminals/websocket/{name}?token={self.token}",
            max_size=None,
            compression=None,
        )

    def delete(self, name: str) -> None:
        httpx.delete(
            f"http://127.0.0.1:{self.port}/api/terminals/{name}",
            headers={"Authorization": f"token {self.token}"},
            timeout=30,
        )

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


async def _jdrain(ws: websockets.ClientConnection, marker: str, limit_s: float = 10) -> str:
    data = ""
    deadline = time.monotonic() + limit_s
    while marker not in data:
        message = json.loads(await asyncio.wait_for(ws.recv(), deadline - time.monotonic()))
        if message[0] == "stdout":
            data += message[1]
    return data


async def jupyter_throughput(jp: Jupyter, total: int) -> float:
    ws = await jp.connect(jp.terminal())
    await ws.send(json.dumps(["stdin", "echo JREADY-$((1+1))\r"]))
    await _jdrain(ws, "JREADY-2")
    await ws.send(json.dumps(["stdin", f"yes | head -c {total}; echo; echo END-$((2+3))\r"]))
    await _jdrain(ws, "\n")
    received = 0
    tail = ""
    start = time.perf_counter()
    while "END-5" not in tail:
        message = json.loads(await ws.recv())
        if message[0] == "stdout":
            received += len(message[1].encode())
            tail = (tail + message[1])[-64:]
    elapsed = time.perf_counter() - start
    await ws.close()
    return received / elapsed / 1e6


async def jupyter_open_to_prompt(jp: Jupyter, count: int) -> dict[str, float]:
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        name = jp.terminal()
        ws = await jp.connect(name)
        data = ""
        while not any(m.decode() in data for m in PROMPTS):
            message = json.loads(await asyncio.wait_for(ws.recv(), 30))
            if message[0] == "stdout":
                data += message[1]
        samples.append((time.perf_counter() - start) * 1000)
        await ws.close()
        jp.delete(name)
    return percentiles(samples)


# --- echo, measured side by side ----------------------------------------------------------------


class Echoer:
    """One terminal typed into one character at a time; `block(n)` adds n round trips.
    Every system's blocks alternate (see `interleaved`), so a noisy neighbour on the machine
    weighs on all of them alike."""

    name = ""
    server_pid: int | None = None
    """The serving process, whose CPU (and its children's) per round trip is reported."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self.sent = 0
        self.cpu = [0, 0]  # ns: the server's own threads, its descendants

    def cpu_now(self) -> tuple[int, int]:
        if self.server_pid is None:
            return 0, 0
        return cpu_ns(self.server_pid), sum(cpu_ns(p) for p in descendants(self.server_pid))

    def result(self) -> dict[str, float]:
        out = percentiles(self.samples)
        if self.server_pid is not None and self.samples:
            out["server_cpu_us"] = round(self.cpu[0] / len(self.samples) / 1000, 1)
            out["children_cpu_us"] = round(self.cpu[1] / len(self.samples) / 1000, 1)
        return out

    async def prepare(self) -> None: ...

    async def roundtrip(self) -> None: ...

    async def newline(self) -> None: ...

    async def close(self) -> None: ...

    async def block(self, rounds: int) -> None:
        before = self.cpu_now()
        for _ in range(rounds):
            start = time.perf_counter()
            await self.roundtrip()
            self.samples.append((time.perf_counter() - start) * 1000)
            self.sent += 1
            if self.sent % 200 == 0:
                await self.newline()
        after = self.cpu_now()
        self.cpu[0] += after[0] - before[0]
        self.cpu[1] += after[1] - before[1]


class RawEcho(Echoer):
    name = "raw_pty"

    async def prepare(self) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execvp("cat", ["cat"])
        await asyncio.sleep(0.2)

    async def roundtrip(self) -> None:
        os.write(self.fd, b"x")
        got = b""
        while b"x" not in got:
            got += os.read(self.fd, 1024)

    async def newline(self) -> None:
        os.write(self.fd, b"\n")
        await asyncio.sleep(0.01)
        os.read(self.fd, 65536)

    async def close(self) -> None:
        os.kill(self.pid, 9)
        os.waitpid(self.pid, 0)  # noqa: ASYNC222 - cat is killed: returns at once
        os.close(self.fd)


class SandpitEcho(Echoer):
    def __init__(self, sp: Sandpit, path: str, name: str, cpu: bool = True) -> None:
        super().__init__()
        self.sp, self.path, self.name = sp, path, name
        if cpu and sp.proc is not None:
            self.server_pid = sp.proc.pid

    async def prepare(self) -> None:
        self.ws = await self.sp.connect(self.path)
        await _drain_until(self.ws, b"$ ")
        await self.ws.send(b"stty -echoctl; cat > /dev/null\r")
        await _drain_until(self.ws, b"stty")
        await asyncio.sleep(0.3)
        for _ in range(20):  # warm-up, not counted
            await self.roundtrip()

    async def roundtrip(self) -> None:
        await self.ws.send(b"x")
        got = b""
        while b"x" not in got:
            frame = await self.ws.recv()
            if isinstance(frame, bytes):
                got += frame

    async def newline(self) -> None:
        await self.ws.send(b"\r")
        await asyncio.sleep(0.01)
        await _drain_until(self.ws, b"\n")

    async def close(self) -> None:
        await self.ws.send(b"\x03")
        await self.ws.close()


class JupyterEcho(Echoer):
    name = "jupyter"

    def __init__(self, jp: Jupyter, name: str = "jupyter", cpu: bool = True) -> None:
        super().__init__()
        self.jp, self.name = jp, name
        if cpu:
            self.server_pid = jp.proc.pid

    async def prepare(self) -> None:
        self.ws = await self.jp.connect(self.jp.terminal())
        await self.ws.send(json.dumps(["stdin", "echo JREADY-$((1+1))\r"]))
        await _jdrain(self.ws, "JREADY-2")
        await self.ws.send(json.dumps(["stdin", "stty -echoctl; cat > /dev/null\r"]))
        await _jdrain(self.ws, "stty")
        await asyncio.sleep(0.3)
        for _ in range(20):
            await self.roundtrip()

    async def roundtrip(self) -> None:
        await self.ws.send(json.dumps(["stdin", "x"]))
        got = ""
        while "x" not in got:
            message = json.loads(await self.ws.recv())
            if message[0] == "stdout":
                got += message[1]

    async def newline(self) -> None:
        await self.ws.send(json.dumps(["stdin", "\r"]))
        await asyncio.sleep(0.01)
        await _jdrain(self.ws, "\n")

    async def close(self) -> None:
        await self.ws.close()


async def interleaved(echoers: list[Echoer], rounds: int, blocks: int = 20) -> dict[str, object]:
    """`rounds` round trips per system, in `blocks` alternating blocks."""
    for echoer in echoers:
        await echoer.prepare()
    try:
        for _ in range(blocks):
            for echoer in echoers:
                await echoer.block(max(1, rounds // blocks))
    finally:
        for echoer in echoers:
            await echoer.close()
    return {e.name: e.result() for e in echoers}


# --- floors for the WebSocket servers themselves -----------------------------------------------
# The same client, the same one-byte binary round trip, no terminal: what the server stack
# alone costs. autobahn on Twisted's asyncio reactor is what daphne serves WebSockets with;
# daphne adds its ASGI queue and a task per socket; tornado is what Jupyter Server uses.


async def floor_echo_asgi(scope: dict, receive: Any, send: Any) -> None:
    """A bare ASGI app for daphne: /echo echoes frames; /pty bridges a PTY in the process
    (write the keystroke, read with loop.add_reader): daphne's floor for a terminal."""
    if scope["type"] != "websocket":
        return
    await receive()  # websocket.connect
    await send({"type": "websocket.accept"})
    if scope["path"] == "/pty":
        await _floor_pty(receive, send)
        return
    while True:
        message = await receive()
        if message["type"] != "websocket.receive":
            return
        await send({"type": "websocket.send", "bytes": message.get("bytes")})


async def _floor_pty(receive: Any, send: Any) -> None:
    loop = asyncio.get_running_loop()
    pid, fd = pty.fork()
    if pid == 0:
        os.execvp("sh", ["sh"])
    os.set_blocking(fd, False)
    queue: asyncio.Queue[bytes] = asyncio.Queue()

    def readable() -> None:
        try:
            queue.put_nowait(os.read(fd, 65536))
        except OSError:
            loop.remove_reader(fd)

    async def pump() -> None:
        while True:
            await send({"type": "websocket.send", "bytes": await queue.get()})

    loop.add_reader(fd, readable)
    task = asyncio.ensure_future(pump())
    try:
        while True:
            message = await receive()
            if message["type"] != "websocket.receive":
                return
            os.write(fd, message.get("bytes") or b"")
    finally:
        task.cancel()
        loop.remove_reader(fd)
        os.kill(pid, 9)
        os.waitpid(pid, 0)  # noqa: ASYNC222 - killed: returns at once
        os.close(fd)


def serve_floor(kind: str, port: int) -> None:
    """(In its own process.) A bare echo WebSocket server: 'autobahn' or 'tornado'."""
    if kind == "autobahn":
        from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
        from twisted.internet import asyncioreactor

        asyncioreactor.install(asyncio.new_event_loop())
        from twisted.internet import reactor

        class Echo(WebSocketServerProtocol):  # type: ignore[misc]
            def onMessage(self, payload: bytes, is_binary: bool) -> None:  # noqa: N802
                self.sendMessage(payload, is_binary)

        factory = WebSocketServerFactory()
        factory.protocol = Echo
        factory.setProtocolOptions(allowNullOrigin=True)  # as daphne sets them
        reactor.listenTCP(port, factory, interface="127.0.0.1")  # type: ignore[attr-defined]
        print("READY", flush=True)
        reactor.run()  # type: ignore[attr-defined]
    elif kind == "tornado":
        import tornado.ioloop
        import tornado.web
        import tornado.websocket

        class Handler(tornado.websocket.WebSocketHandler):
            def on_message(self, message: str | bytes) -> None:
                self.write_message(message, binary=isinstance(message, bytes))

        async def run() -> None:
            tornado.web.Application([(r"/echo", Handler)]).listen(port, "127.0.0.1")
            print("READY", flush=True)
            await asyncio.Event().wait()

        asyncio.run(run())


class Floors:
    """The floor servers: bare autobahn, tornado, and daphne serving a bare ASGI app."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.ports = {kind: free_port() for kind in ("autobahn", "tornado", "daphne")}
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        for kind in ("autobahn", "tornado"):
            proc = subprocess.Popen(
                [sys.executable, __file__, "--floor-server", kind, str(self.ports[kind])],
                stdout=subprocess.PIPE,
            )
            self.procs.append(proc)
            assert proc.stdout is not None
            if b"READY" not in proc.stdout.readline():
                raise RuntimeError(f"{kind} floor did not start")
        self.procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "playground.webserver",  # daphne as Sandpit runs it (its event loop)
                    "--processes",
                    "1",
                    "-b",
                    "127.0.0.1",
                    "-p",
                    str(self.ports["daphne"]),
                    "bench_terminal:floor_echo_asgi",
                ],
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": f"{ROOT}:{Path(__file__).parent}"},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.ports["daphne"])) == 0:
                    return
            time.sleep(0.1)
        raise RuntimeError("daphne floor did not start")

    def url(self, kind: str, path: str = "/echo") -> str:
        return f"ws://127.0.0.1:{self.ports[kind]}{path}"

    def pid(self, kind: str) -> int:
        return self.procs[("autobahn", "tornado", "daphne").index(kind)].pid

    def echoers(self) -> list[Echoer]:
        pids = {kind: self.pid(kind) for kind in ("autobahn", "tornado", "daphne")}
        return [
            FloorEcho(self.url("autobahn"), "floor_autobahn", pids["autobahn"]),
            FloorEcho(self.url("daphne"), "floor_daphne_asgi", pids["daphne"]),
            FloorEcho(self.url("daphne", "/pty"), "floor_daphne_pty", pids["daphne"], True),
            FloorEcho(self.url("tornado"), "floor_tornado", pids["tornado"]),
        ]

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
            proc.wait(10)


class _Jails:
    """The bench's local jails' agents, reached by their socket paths (no Django here)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def agent_socket(self, provider_id: str) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(10)
        sock.connect(str(self.root / provider_id / "run" / "agent.sock"))
        return sock

    def attach(self, terminal_id: str) -> SessionLink:
        for run_dir in self.root.glob("*/run"):
            provider_id = run_dir.parent.name
            try:
                sessions = session_list(self, provider_id, "pty")
            except Exception:  # noqa: BLE001, S112 - a jail starting or gone
                continue
            if any(s.id == terminal_id for s in sessions):
                return session_attach(self, provider_id, terminal_id)
        raise RuntimeError(f"no jail holds {terminal_id}")


class AgentHopEcho(Echoer):
    """A Sandpit terminal typed into from this process through the agent link a web process
    uses (keystrokes to the PTY master passed by SCM_RIGHTS, echo back in the agent's
    frames), with no WebSocket and no daphne: the floor of the sandbox side of the path."""

    name = "floor_agent_hop"

    def __init__(self, sp: Sandpit, ws_path: str) -> None:
        super().__init__()
        self.jails = _Jails(sp.workdir / "sandboxes")
        self.terminal_id = ws_path.rstrip("/").rsplit("/", 1)[-1]
        self.got = b""
        self.want = b""
        self.arrived: asyncio.Future[None] | None = None

    def _output(self, _kind: bytes, data: bytes) -> None:
        self.got += data
        if self.want in self.got and self.arrived is not None and not self.arrived.done():
            self.arrived.set_result(None)

    async def _until(self, marker: bytes, send: bytes = b"") -> None:
        self.got, self.want = b"", marker
        self.arrived = asyncio.get_running_loop().create_future()
        if send:
            self.link.write(send)
        await asyncio.wait_for(self.arrived, 10)

    async def prepare(self) -> None:
        self.link = self.jails.attach(self.terminal_id)
        self.got, self.want = b"", b"$ "
        self.arrived = asyncio.get_running_loop().create_future()
        self.link.start(self._output, lambda _result: None)
        await asyncio.wait_for(self.arrived, 10)
        await self._until(b"stty", ECHO_CMD.encode())
        await asyncio.sleep(0.3)
        for _ in range(20):
            await self.roundtrip()

    async def roundtrip(self) -> None:
        await self._until(b"x", b"x")

    async def newline(self) -> None:
        await self._until(b"\n", b"\r")

    async def close(self) -> None:
        self.link.write(b"\x03")
        self.link.close()


class FloorEcho(Echoer):
    """One-byte binary round trips to a floor server (echo, or daphne's in-process PTY)."""

    def __init__(self, url: str, name: str, pid: int, terminal: bool = False) -> None:
        super().__init__()
        self.url, self.name, self.terminal = url, name, terminal
        self.server_pid = pid

    async def prepare(self) -> None:
        self.ws = await websockets.connect(self.url, max_size=None, compression=None)
        if self.terminal:  # as SandpitEcho does
            await _drain_any(self.ws, PROMPTS)
            await self.ws.send(ECHO_CMD.encode())
            await _drain_until(self.ws, b"stty")
            await asyncio.sleep(0.3)
        for _ in range(20):
            await self.roundtrip()

    async def roundtrip(self) -> None:
        await self.ws.send(b"x")
        got = b""
        while b"x" not in got:
            frame = await self.ws.recv()
            if isinstance(frame, bytes):
                got += frame

    async def newline(self) -> None:
        if self.terminal:
            await self.ws.send(b"\r")
            await asyncio.sleep(0.01)
            await _drain_until(self.ws, b"\n")

    async def close(self) -> None:
        await self.ws.close()


# --- main --------------------------------------------------------------------------------------


async def main(args: argparse.Namespace) -> dict[str, object]:
    total = args.mb * 1_000_000
    results: dict[str, object] = {}
    workdir = Path(tempfile.mkdtemp(prefix="bench-terminal-"))
    workdir.chmod(0o711)  # noqa: ASYNC240 - set-up before any server runs; jails (own host uids) pass through it
    providers = "local,docker" if args.docker else "local"
    sp = Sandpit(workdir, providers)
    jp = Jupyter(workdir)
    floors = Floors(workdir)
    try:
        print("starting sandpit (daphne), jupyter_server and the floor servers ...", flush=True)
        sp.setup()
        jp.start()
        floors.start()
        sandbox_id = sp.sandbox()
        docker_id = sp.sandbox("docker") if args.docker else None

        print("echo, side by side ...", flush=True)
        echoers: list[Echoer] = [
            RawEcho(),
            SandpitEcho(sp, sp.terminal(sandbox_id), "sandpit_local"),
            JupyterEcho(jp),
        ]
        if docker_id:
            echoers.insert(2, SandpitEcho(sp, sp.terminal(docker_id), "sandpit_docker"))
        echoers += [AgentHopEcho(sp, sp.terminal(sandbox_id)), *floors.echoers()]
        results["echo"] = await interleaved(echoers, args.rounds)

        print("output throughput, alternating, median of 3 ...", flush=True)
        runs: dict[str, list[float]] = {}
        cpu: dict[str, list[int]] = {}
        assert sp.proc is not None

        async def timed(name: str, pid: int, run: Coroutine[Any, Any, float]) -> None:
            before = _tree_cpu_ns(pid)
            runs.setdefault(name, []).append(await run)
            spent = cpu.setdefault(name, [0, 0])
            for i, after in enumerate(_tree_cpu_ns(pid)):
                spent[i] += after - before[i]

        for _ in range(3):
            runs.setdefault("raw_pty", []).append(raw_pty_throughput(total))
            await timed(
                "sandpit_local", sp.proc.pid, sandpit_throughput(sp, sp.terminal(sandbox_id), total)
            )
            if docker_id:
                await timed(
                    "sandpit_docker",
                    sp.proc.pid,
                    sandpit_throughput(sp, sp.terminal(docker_id), total),
                )
            await timed("jupyter", jp.proc.pid, jupyter_throughput(jp, total))
            floor_ws = await websockets.connect(
                floors.url("daphne", "/pty"), max_size=None, compression=None
            )
            await timed("floor_daphne_pty", floors.pid("daphne"), ws_throughput(floor_ws, total))
        # CPU per MB delivered: the server's own, and its children's (agents, shells, yes).
        results["output_cpu_ms_per_mb"] = {
            name: [round(ns / 1e6 / (3 * total / 1e6), 1) for ns in spent]
            for name, spent in cpu.items()
        }
        results["output_mb_s"] = {k: round(statistics.median(v), 1) for k, v in runs.items()}
        results["output_runs_mb_s"] = {k: [round(x, 1) for x in v] for k, v in runs.items()}

        if args.opens:
            print("open to first prompt ...", flush=True)
            opens: dict[str, object] = {
                "sandpit_local": await sandpit_open_to_prompt(sp, sandbox_id, args.opens),
                "jupyter": await jupyter_open_to_prompt(jp, args.opens),
            }
            if docker_id:
                opens["sandpit_docker"] = await sandpit_open_to_prompt(sp, docker_id, args.opens)
            results["open_to_prompt"] = opens
        if docker_id:
            sp.http.delete(f"/api/v1/sandboxes/{docker_id}")
        sp.http.delete(f"/api/v1/sandboxes/{sandbox_id}")

        if args.load:
            print(f"echo with {args.load} terminals streaming in each ...", flush=True)
            results["echo_under_load"] = await echo_under_load(sp, jp, args.load, args.rounds)

        jp.stop()
        floors.stop()
        print(f"{args.idle} idle terminals ...", flush=True)
        results["idle"] = await sandpit_idle(sp, args.idle, "local")
        echo = results["echo"]
        out = results["output_mb_s"]
        jup = echo["jupyter"]  # type: ignore[index]
        loc = echo["sandpit_local"]  # type: ignore[index]
        results["targets"] = {
            "echo_p50_vs_jupyter_p50 (<= 0.6)": round(loc["p50_ms"] / jup["p50_ms"], 2),
            "echo_p99_vs_jupyter_p50 (<= 2)": round(loc["p99_ms"] / jup["p50_ms"], 2),
            "output_vs_raw (>= 0.8)": round(out["sandpit_local"] / out["raw_pty"], 2),  # type: ignore[index]
        }
        if args.load:
            loaded = results["echo_under_load"]
            results["targets"]["loaded_p99_vs_jupyter_loaded_p99 (< 1)"] = round(  # type: ignore[index]
                loaded["sandpit_local"]["p99_ms"] / loaded["jupyter"]["p99_ms"],  # type: ignore[index]
                2,
            )
    finally:
        for handle in sp.http.get("/api/v1/sandboxes").json().get("results", []) if sp.key else []:
            sp.http.delete(f"/api/v1/sandboxes/{handle['id']}")
        sp.stop()
        for server in (jp, floors):
            try:
                server.stop()
            except Exception:  # noqa: BLE001, S110 - already stopped
                pass
        shutil.rmtree(workdir, ignore_errors=True)
    return results


async def echo_under_load(sp: Sandpit, jp: Jupyter, load: int, rounds: int) -> dict[str, object]:
    """`load` Sandpit terminals and `load` Jupyter terminals stream output at once (each read
    by a client process of its own); meanwhile one more of each measures echo, side by side."""
    per_sandbox = 17
    sandboxes = [sp.sandbox("local") for _ in range((load + per_sandbox - 1) // per_sandbox)]
    paths = [sp.terminal(sandboxes[i // per_sandbox]) for i in range(load)]
    names = [jp.terminal() for _ in range(load)]
    assert sp.proc is not None
    servers = {"sandpit": sp.proc.pid, "jupyter": jp.proc.pid}
    sandpit_load = await start_load(
        {
            "kind": "sandpit",
            "urls": [f"ws://127.0.0.1:{sp.port}{p}" for p in paths],
            "origin": sp.base,
            "headers": {"Authorization": f"Bearer {sp.key}"},
        }
    )
    jupyter_load = await start_load(
        {
            "kind": "jupyter",
            "urls": [
                f"ws://127.0.0.1:{jp.port}/terminals/websocket/{n}?token={jp.token}" for n in names
            ],
        }
    )
    result: dict[str, object] = {}
    # Both loads stream through the whole echo phase: what each server (and its children:
    # agents, shells) spends meanwhile, in % of one core, is the per-chunk cost of 50
    # streams that the 51st's echo waits behind (connection set-up left out).
    cpu_before = {name: _tree_cpu_ns(pid) for name, pid in servers.items()}
    started = time.perf_counter()
    try:
        result = await interleaved(
            [
                SandpitEcho(sp, sp.terminal(sandboxes[0]), "sandpit_local", cpu=False),
                JupyterEcho(jp, cpu=False),
            ],
            rounds,
        )
    finally:
        elapsed_ns = (time.perf_counter() - started) * 1e9
        result["load_server_cpu_pct"] = {
            name: [
                round((after - start) / elapsed_ns * 100, 1)
                for start, after in zip(cpu_before[name], _tree_cpu_ns(pid), strict=True)
            ]
            for name, pid in servers.items()
        }
        received = {
            "sandpit": json.loads(await stop_load(sandpit_load))["received_mb"],
            "jupyter": json.loads(await stop_load(jupyter_load))["received_mb"],
        }
        result["load_received_mb"] = received
        for sandbox_id in sandboxes:
            sp.http.delete(f"/api/v1/sandboxes/{sandbox_id}")
        for name in names:
            jp.delete(name)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--mb", type=int, default=50)
    parser.add_argument("--idle", type=int, default=100)
    parser.add_argument("--docker", action="store_true")
    parser.add_argument("--load", type=int, default=50)
    parser.add_argument("--opens", type=int, default=10)
    parser.add_argument("--load-client", help=argparse.SUPPRESS)
    parser.add_argument("--floor-server", nargs=2, help=argparse.SUPPRESS)
    parsed = parser.parse_args()
    if parsed.floor_server:
        serve_floor(parsed.floor_server[0], int(parsed.floor_server[1]))
        sys.exit(0)
    if parsed.load_client:
        asyncio.run(_load_client(json.loads(parsed.load_client)))
        sys.exit(0)
    print(json.dumps(asyncio.run(main(parsed)), indent=2))
