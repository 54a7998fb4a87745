"""Terminal benchmarks: keystroke echo latency, output throughput, open-to-prompt, load.

Compares, in one run on this machine:
  * a raw local PTY (pty.fork + write/read) - the floor;
  * Sandpit: WebSocket -> daphne -> TerminalConsumer -> the sandbox agent's PTY (local, and
    docker with --docker), the path a browser uses;
  * Jupyter Server's terminals (terminado's JSON ["stdin", ...] protocol over its WebSocket).

Echo is measured side by side: every system's blocks of round trips alternate, so a noisy
machine weighs on all alike; throughput alternates too (median of 3). With --load N, N
Sandpit and N Jupyter terminals stream output at once (each ~20 KB/s, read by client
processes of their own) while one more of each measures echo, side by side.

Run:  .venv/bin/python bench/bench_terminal.py [--rounds 500] [--mb 50] [--idle 100] [--docker]
                                              [--load 50] [--opens 10]
It uses a throwaway SQLite database and var directory (no Redis: in-memory channel layer),
starts daphne and jupyter_server on free loopback ports and stops them at the end.
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
from pathlib import Path

import httpx
import websockets

ROOT = Path(__file__).resolve().parents[1]
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
                str(BIN / "daphne"),
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
    ws = await sp.connect(path)
    await _drain_until(ws, b"$ ")
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

    def __init__(self) -> None:
        self.samples: list[float] = []
        self.sent = 0

    async def prepare(self) -> None: ...

    async def roundtrip(self) -> None: ...

    async def newline(self) -> None: ...

    async def close(self) -> None: ...

    async def block(self, rounds: int) -> None:
        for _ in range(rounds):
            start = time.perf_counter()
            await self.roundtrip()
            self.samples.append((time.perf_counter() - start) * 1000)
            self.sent += 1
            if self.sent % 200 == 0:
                await self.newline()


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
    def __init__(self, sp: Sandpit, path: str, name: str) -> None:
        super().__init__()
        self.sp, self.path, self.name = sp, path, name

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

    def __init__(self, jp: Jupyter, name: str = "jupyter") -> None:
        super().__init__()
        self.jp, self.name = jp, name

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
    return {e.name: percentiles(e.samples) for e in echoers}


# --- main --------------------------------------------------------------------------------------


async def main(args: argparse.Namespace) -> dict[str, object]:
    total = args.mb * 1_000_000
    results: dict[str, object] = {}
    workdir = Path(tempfile.mkdtemp(prefix="bench-terminal-"))
    workdir.chmod(0o711)  # noqa: ASYNC240 - set-up before any server runs; jails (own host uids) pass through it
    providers = "local,docker" if args.docker else "local"
    sp = Sandpit(workdir, providers)
    jp = Jupyter(workdir)
    try:
        print("starting sandpit (daphne) and jupyter_server ...", flush=True)
        sp.setup()
        jp.start()
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
        results["echo"] = await interleaved(echoers, args.rounds)

        print("output throughput, alternating, median of 3 ...", flush=True)
        runs: dict[str, list[float]] = {}
        for _ in range(3):
            runs.setdefault("raw_pty", []).append(raw_pty_throughput(total))
            runs.setdefault("sandpit_local", []).append(
                await sandpit_throughput(sp, sp.terminal(sandbox_id), total)
            )
            if docker_id:
                runs.setdefault("sandpit_docker", []).append(
                    await sandpit_throughput(sp, sp.terminal(docker_id), total)
                )
            runs.setdefault("jupyter", []).append(await jupyter_throughput(jp, total))
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
        try:
            jp.stop()
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
    try:
        result = await interleaved(
            [SandpitEcho(sp, sp.terminal(sandboxes[0]), "sandpit_local"), JupyterEcho(jp)],
            rounds,
        )
    finally:
        result["load_received"] = {
            "sandpit": await stop_load(sandpit_load),
            "jupyter": await stop_load(jupyter_load),
        }
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
    parsed = parser.parse_args()
    if parsed.load_client:
        asyncio.run(_load_client(json.loads(parsed.load_client)))
        sys.exit(0)
    print(json.dumps(asyncio.run(main(parsed)), indent=2))
