"""Creates in order of arrival, a few at a time (playground/admission.py), and warm pools
that fill before a web process's first request (playground/webserver.py)."""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.urls import resolve

from playground.admission import (
    CREATE_PATHS,
    UNPROVEN_LINE,
    CreateAdmission,
    FairGate,
    ProvenCallers,
    caller_credential,
)
from playground.asgi import application
from tests.requirements import jail_root
from tests.servers import free_port, server_start

ROOT = Path(__file__).resolve().parents[2]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_places_are_given_in_order_of_arrival_and_never_more_than_the_gate_has() -> None:
    async def scenario() -> tuple[list[int], int]:
        gate = FairGate(2, hold_limit_s=60)
        order: list[int] = []
        inside = peak = 0

        async def one(index: int) -> None:
            nonlocal inside, peak
            held = await gate.enter()
            order.append(index)
            inside += 1
            peak = max(peak, inside)
            await asyncio.sleep(0.01)
            inside -= 1
            gate.leave(held)

        tasks = []
        for index in range(12):
            tasks.append(asyncio.create_task(one(index)))
            await asyncio.sleep(0)  # arrive one after another
        await asyncio.gather(*tasks)
        assert gate.taken == 0
        return order, peak

    order, peak = run(scenario())
    assert order == list(range(12))
    assert peak == 2


def test_a_newcomer_does_not_overtake_a_woken_waiter() -> None:
    async def scenario() -> list[str]:
        gate = FairGate(1, hold_limit_s=60)
        order: list[str] = []
        first = await gate.enter()

        async def waiter(name: str) -> None:
            held = await gate.enter()
            order.append(name)
            gate.leave(held)

        queued = asyncio.create_task(waiter("queued"))
        await asyncio.sleep(0)
        gate.leave(first)  # wakes "queued"; it has not run yet
        newcomer = asyncio.create_task(waiter("newcomer"))
        await asyncio.gather(queued, newcomer)
        return order

    assert run(scenario()) == ["queued", "newcomer"]


def test_a_place_held_past_the_limit_passes_to_the_next_and_is_freed_once() -> None:
    async def scenario() -> None:
        gate = FairGate(1, hold_limit_s=0.05)
        slow = await gate.enter()
        started = time.monotonic()
        nxt = await gate.enter()  # admitted when the slow one's hold runs out
        assert time.monotonic() - started >= 0.04
        gate.leave(slow)  # the limit already gave its place away: nothing more
        assert gate.taken == 1
        gate.leave(nxt)
        assert gate.taken == 0
        again = await asyncio.wait_for(gate.enter(), 1)
        gate.leave(again)
        assert gate.taken == 0

    run(scenario())


def test_cancelled_waiters_lose_no_place() -> None:
    async def scenario() -> None:
        gate = FairGate(1, hold_limit_s=60)
        held = await gate.enter()
        # Cancelled while waiting.
        waiting = asyncio.create_task(gate.enter())
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        # Cancelled after being woken, before it ran: the place goes to the next.
        woken = asyncio.create_task(gate.enter())
        after = asyncio.create_task(gate.enter())
        await asyncio.sleep(0)
        gate.leave(held)
        woken.cancel()
        with pytest.raises(asyncio.CancelledError):
            await woken
        last = await asyncio.wait_for(after, 1)
        assert gate.taken == 1
        gate.leave(last)
        assert gate.taken == 0

    run(scenario())


def test_callers_are_served_in_turn_one_callers_flood_does_not_queue_ahead_of_another() -> None:
    async def scenario() -> list[str]:
        gate = FairGate(1, hold_limit_s=60)
        order: list[str] = []
        first = await gate.enter("flood")

        async def one(line: str, name: str) -> None:
            held = await gate.enter(line)
            order.append(name)
            await asyncio.sleep(0)
            gate.leave(held)

        tasks = [asyncio.create_task(one("flood", f"flood-{i}")) for i in range(20)]
        await asyncio.sleep(0)
        tasks += [asyncio.create_task(one("other", f"other-{i}")) for i in range(2)]
        await asyncio.sleep(0)
        gate.leave(first)
        await asyncio.gather(*tasks)
        assert gate.taken == 0
        return order

    order = run(scenario())
    # Turns alternate while both wait; each caller's own creates keep their order.
    assert order[:4] == ["flood-0", "other-0", "flood-1", "other-1"]
    assert [n for n in order if n.startswith("flood")] == [f"flood-{i}" for i in range(20)]


def test_the_credential_is_the_key_header_else_the_cookie() -> None:
    def scope(*headers: tuple[bytes, bytes]) -> dict[str, Any]:
        return {"type": "http", "headers": list(headers)}

    assert caller_credential(scope((b"authorization", b"Bearer sp_a"))) == b"Bearer sp_a"
    assert caller_credential(scope((b"X-API-Key", b"sp_b"))) == b"sp_b"
    assert caller_credential(
        scope((b"cookie", b"sessionid=s"), (b"authorization", b"Bearer k"))
    ) == (b"Bearer k")
    assert caller_credential(scope((b"cookie", b"sessionid=s"))) == b"sessionid=s"
    assert caller_credential(scope()) == b""


def test_only_an_authenticated_answer_proves_a_credential_and_the_set_stays_bounded() -> None:
    proven = ProvenCallers(limit=3)
    refused, never_answered = proven.digest(b"Bearer forged"), proven.digest(b"Bearer gone")
    proven.answered(refused, 401)
    proven.answered(refused, 403)
    proven.answered(never_answered, None)  # the client left before any answer
    assert proven.line(refused) == proven.line(never_answered) == UNPROVEN_LINE
    keys = [proven.digest(f"Bearer sp_{i}".encode()) for i in range(5)]
    for key, status in zip(keys, (201, 429, 402, 400, 201), strict=True):
        proven.answered(key, status)  # refused for other reasons, but authenticated
    assert len(proven) == 3
    assert [proven.line(key) for key in keys] == [UNPROVEN_LINE] * 2 + keys[2:]
    assert b"sp_" not in repr(proven._proven).encode()  # digests only, never the secret


class Answering:
    """An ASGI app answering 201 to `Bearer good`, 401 to anything else, holding each
    request until released; notes the order requests got in."""

    def __init__(self) -> None:
        self.inside: list[str] = []
        self.release = asyncio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        key = caller_credential(scope).decode()
        self.inside.append(key)
        await self.release.wait()
        await send({"type": "http.response.start", "status": 201 if key == "Bearer good" else 401})
        await send({"type": "http.response.body", "body": b""})


def test_forged_keys_share_one_line_a_proven_caller_keeps_its_turns() -> None:
    async def sent(message: dict[str, Any]) -> None:
        return None

    def create(key: str) -> dict[str, Any]:
        return {
            "type": "http",
            "method": "POST",
            "path": "/api/v1/sandboxes",
            "headers": [(b"authorization", key.encode())],
        }

    async def scenario() -> list[str]:
        app = Answering()
        admission = CreateAdmission(app, places=1)
        app.release.set()
        await admission(create("Bearer good"), None, sent)  # proves the key
        app.release.clear()
        holder = asyncio.create_task(admission(create("Bearer forged-holder"), None, sent))
        await asyncio.sleep(0)
        tasks = [
            asyncio.create_task(admission(create(f"Bearer forged-{i}"), None, sent))
            for i in range(30)
        ]
        await asyncio.sleep(0)
        tasks += [
            asyncio.create_task(admission(create("Bearer good"), None, sent)) for _ in range(3)
        ]
        await asyncio.sleep(0)
        app.release.set()
        await asyncio.gather(holder, *tasks)
        assert admission.gate is not None and admission.gate.taken == 0
        return app.inside[2:]

    order = run(scenario())
    # Thirty forged keys are one line, not thirty: the proven caller gets every other turn.
    assert order[:6] == [
        "Bearer forged-0",
        "Bearer good",
        "Bearer forged-1",
        "Bearer good",
        "Bearer forged-2",
        "Bearer good",
    ]
    assert [key for key in order if key != "Bearer good"] == [
        f"Bearer forged-{i}" for i in range(30)
    ]


def test_a_gate_needs_a_place() -> None:
    with pytest.raises(ValueError):
        FairGate(0)


class Recorder:
    """An ASGI app that holds every request until released, noting which are inside."""

    def __init__(self) -> None:
        self.inside: list[str] = []
        self.release = asyncio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.inside.append(f"{scope['method']} {scope['path']}")
        await self.release.wait()


def http_scope(method: str, path: str) -> dict[str, Any]:
    return {"type": "http", "method": method, "path": path}


def test_only_creates_queue_other_requests_pass_a_full_gate() -> None:
    async def scenario() -> list[str]:
        app = Recorder()
        admission = CreateAdmission(app, places=1)
        requests = [
            ("POST", "/api/v1/sandboxes"),
            ("POST", "/e2b/sandboxes"),  # queued behind the first create
            ("POST", "/api/v1/sandboxes/abc/commands"),
            ("GET", "/api/v1/sandboxes"),
            ("POST", "/e2b/v2/sandboxes"),  # queued
        ]
        tasks = [asyncio.create_task(admission(http_scope(m, p), None, None)) for m, p in requests]
        await asyncio.sleep(0.01)
        seen = list(app.inside)
        app.release.set()
        await asyncio.gather(*tasks)
        assert len(app.inside) == len(requests)
        return seen

    assert run(scenario()) == [
        "POST /api/v1/sandboxes",
        "POST /api/v1/sandboxes/abc/commands",
        "GET /api/v1/sandboxes",
    ]


class Held:
    """An ASGI app holding each request until its own path is released; notes who is in."""

    def __init__(self) -> None:
        self.inside: list[str] = []
        self.done: list[str] = []
        self.releases: dict[str, asyncio.Event] = {}

    def release(self, path: str) -> None:
        self.releases.setdefault(path, asyncio.Event()).set()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.inside.append(scope["path"])
        await self.releases.setdefault(scope["path"], asyncio.Event()).wait()
        self.done.append(scope["path"])


PROVEN_KEY = b"Bearer sp_proven"


def proven_admission(app: Any, places: int) -> CreateAdmission:
    """A gate that has seen PROVEN_KEY answered as authenticated."""
    admission = CreateAdmission(app, places=places)
    admission.proven.answered(admission.proven.digest(PROVEN_KEY), 200)
    return admission


def assert_gate_empty(admission: CreateAdmission) -> None:
    """No place held, by a create or ahead of one."""
    gate = admission.gate
    assert gate is not None
    assert (gate.taken, gate.ahead) == (0, 0)


def request(
    admission: CreateAdmission, method: str, path: str, key: bytes = PROVEN_KEY
) -> asyncio.Task[None]:
    scope = {**http_scope(method, path), "headers": [(b"authorization", key)]}
    return asyncio.create_task(admission(scope, None, None))


async def on_a_sandbox_then_two_creates(
    admission: CreateAdmission, method: str, path: str, second_create: str
) -> tuple[asyncio.Task[None], ...]:
    """A request on a sandbox, then two creates, each arriving after the one before."""
    tasks = []
    for method_, path_ in ((method, path), ("POST", "/api/v1/sandboxes"), ("POST", second_create)):
        tasks.append(request(admission, method_, path_))
        await asyncio.sleep(0)
    return tuple(tasks)


def test_a_request_on_a_sandbox_keeps_the_next_create_waiting_until_it_ends() -> None:
    async def scenario() -> None:
        app = Held()
        admission = proven_admission(app, places=2)
        command, first, second = await on_a_sandbox_then_two_creates(
            admission, "POST", "/api/v1/sandboxes/sbx_a/commands", "/e2b/sandboxes"
        )
        await asyncio.sleep(0.01)
        # The command and one create hold the two places; the next create waits.
        assert app.inside == ["/api/v1/sandboxes/sbx_a/commands", "/api/v1/sandboxes"]
        app.release("/api/v1/sandboxes/sbx_a/commands")
        await command
        await asyncio.sleep(0.01)
        assert app.inside[-1] == "/e2b/sandboxes"
        app.release("/api/v1/sandboxes")
        app.release("/e2b/sandboxes")
        await asyncio.gather(first, second)
        assert_gate_empty(admission)

    run(scenario())


def test_requests_on_sandboxes_take_all_places_but_one_so_creates_always_move() -> None:
    async def scenario() -> None:
        app = Held()
        admission = proven_admission(app, places=3)
        commands = [
            request(admission, "POST", f"/api/v1/sandboxes/sbx_{i}/commands") for i in range(5)
        ]
        await asyncio.sleep(0)
        creates = [request(admission, "POST", "/api/v1/sandboxes") for _ in range(2)]
        await asyncio.sleep(0.01)
        gate = admission.gate
        assert gate is not None
        # Every command runs at once (none waits); two of them hold places, one is left.
        assert len([p for p in app.inside if p.endswith("/commands")]) == 5
        assert app.inside.count("/api/v1/sandboxes") == 1
        assert (gate.taken, gate.ahead) == (3, 2)
        for i in range(5):
            app.release(f"/api/v1/sandboxes/sbx_{i}/commands")
        await asyncio.gather(*commands)
        await asyncio.sleep(0.01)
        assert app.inside.count("/api/v1/sandboxes") == 2
        app.release("/api/v1/sandboxes")
        await asyncio.gather(*creates)
        assert_gate_empty(admission)

    run(scenario())


def test_a_long_request_on_a_sandbox_holds_creates_back_only_for_the_follow_up_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("playground.admission.FOLLOW_UP_HOLD_S", 0.05)

    async def scenario() -> None:
        app = Held()
        admission = proven_admission(app, places=2)
        started = time.monotonic()
        build, first, second = await on_a_sandbox_then_two_creates(
            admission, "POST", "/api/v1/sandboxes/sbx_a/commands", "/e2b/v2/sandboxes"
        )
        while "/e2b/v2/sandboxes" not in app.inside:
            await asyncio.sleep(0.005)
            assert time.monotonic() - started < 5
        assert time.monotonic() - started >= 0.04
        assert "/api/v1/sandboxes/sbx_a/commands" not in app.done  # still running
        app.release("/api/v1/sandboxes/sbx_a/commands")
        app.release("/api/v1/sandboxes")
        app.release("/e2b/v2/sandboxes")
        await asyncio.gather(build, first, second)
        # The limit gave the place back once; the request's end did not give it twice.
        assert_gate_empty(admission)

    run(scenario())


def test_a_cancelled_request_on_a_sandbox_gives_its_place_back() -> None:
    async def scenario() -> None:
        app = Held()
        admission = proven_admission(app, places=2)
        command, first, second = await on_a_sandbox_then_two_creates(
            admission, "GET", "/api/v1/sandboxes/sbx_a/files", "/api/v1/sandboxes"
        )
        await asyncio.sleep(0.01)
        assert app.inside.count("/api/v1/sandboxes") == 1
        command.cancel()  # the client went away
        await asyncio.sleep(0.01)
        assert app.inside.count("/api/v1/sandboxes") == 2
        app.release("/api/v1/sandboxes")
        await asyncio.gather(first, second)
        assert_gate_empty(admission)

    run(scenario())


def test_only_requests_below_a_create_route_take_a_place() -> None:
    async def scenario() -> list[int]:
        app = Held()
        admission = proven_admission(app, places=2)
        taken = []
        for method, path in [
            ("GET", "/api/v1/sandboxes"),  # the list, not one sandbox
            ("GET", "/api/v1/sandboxesX/a"),
            ("GET", "/api/v1/organization"),
            ("GET", "/health/live"),
            ("POST", "/api/v1/sandboxes/sbx_a/commands"),
            ("GET", "/e2b/sandboxes/sbx_a"),
        ]:
            request(admission, method, path)
            await asyncio.sleep(0)
            taken.append(admission.gate.taken if admission.gate is not None else 0)
        for path in set(app.inside):
            app.release(path)
        await asyncio.sleep(0.01)
        return taken

    # The second request below a create route finds the one place left for creates.
    assert run(scenario()) == [0, 0, 0, 0, 1, 1]


def test_forged_credentials_take_no_place_ahead_an_authenticated_answer_proves_one() -> None:
    async def scenario() -> None:
        app = Held()
        admission = proven_admission(app, places=2)
        forged = [
            request(
                admission, "GET", f"/api/v1/sandboxes/sbx_{i}", key=f"Bearer forged-{i}".encode()
            )
            for i in range(20)
        ]
        creates = [request(admission, "POST", "/api/v1/sandboxes") for _ in range(2)]
        await asyncio.sleep(0.01)
        # A flood of requests under forged keys leaves creates every place.
        assert app.inside.count("/api/v1/sandboxes") == 2
        gate = admission.gate
        assert gate is not None and gate.ahead == 0
        for task in [*forged, *creates]:
            task.cancel()
        await asyncio.gather(*forged, *creates, return_exceptions=True)

        # A sandbox token never used to create: its first answered request proves it.
        async def answering(scope: dict[str, Any], receive: Any, send: Any) -> None:
            await send({"type": "http.response.start", "status": 200})

        async def sent(message: dict[str, Any]) -> None:
            return None

        token = [(b"authorization", b"Bearer sbx_token")]
        admission.app = answering
        scope = {**http_scope("GET", "/api/v1/sandboxes/sbx_a"), "headers": token}
        await admission(scope, None, sent)
        admission.app = app
        held = request(admission, "POST", "/api/v1/sandboxes/sbx_a/commands", b"Bearer sbx_token")
        await asyncio.sleep(0.01)
        assert (gate.taken, gate.ahead) == (1, 1)
        app.release("/api/v1/sandboxes/sbx_a/commands")
        await held
        assert_gate_empty(admission)

    run(scenario())


def test_creates_and_requests_on_sandboxes_interleaved_at_random_keep_the_gate_whole() -> None:
    """Races: 300 creates and requests on sandboxes arriving, ending and cancelled in a
    seeded random order; at no moment more creates in than places, nor more places taken
    ahead than all but one; every request gets in and the gate ends empty."""
    rng = random.Random(18)

    async def scenario() -> None:
        places = 4
        creates_in = peak = 0
        gate_seen: list[FairGate] = []

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            nonlocal creates_in, peak
            is_create = scope["path"] in CREATE_PATHS
            creates_in += is_create
            peak = max(peak, creates_in)
            gate = gate_seen[0]
            assert gate.ahead <= places - 1
            try:
                await asyncio.sleep(rng.choice([0, 0.001, 0.003, 0.02]))
            finally:
                creates_in -= is_create

        admission = proven_admission(app, places=places)
        admission.gate = FairGate(places)
        gate_seen.append(admission.gate)
        tasks = []
        for i in range(300):
            path = "/api/v1/sandboxes" if rng.random() < 0.5 else f"/api/v1/sandboxes/s{i}/exec"
            tasks.append(request(admission, "POST", path))
            if rng.random() < 0.1:
                rng.choice(tasks).cancel()
            await asyncio.sleep(rng.choice([0, 0, 0.001]))
        await asyncio.gather(*tasks, return_exceptions=True)
        assert peak <= places
        assert_gate_empty(admission)

    run(scenario())


def test_zero_places_admit_every_create_at_once() -> None:
    async def scenario() -> int:
        app = Recorder()
        admission = CreateAdmission(app, places=0)
        tasks = [
            asyncio.create_task(admission(http_scope("POST", "/api/v1/sandboxes"), None, None))
            for _ in range(5)
        ]
        await asyncio.sleep(0.01)
        inside = len(app.inside)
        app.release.set()
        await asyncio.gather(*tasks)
        return inside

    assert run(scenario()) == 5


def test_the_gated_paths_are_the_create_routes() -> None:
    for path in CREATE_PATHS:
        view_class = resolve(path).func.cls  # type: ignore[attr-defined] # DRF's as_view sets it
        assert view_class.__name__ in {"SandboxListApi", "SandboxesApi"}, path
        assert "post" in view_class.http_method_names


def test_the_served_application_passes_http_through_the_gate(settings) -> None:  # type: ignore[no-untyped-def]
    outer = application.application_mapping["http"]  # E2BRouter: Connect RPC, then the rest
    assert isinstance(outer.app, CreateAdmission)
    assert outer.app.places == settings.SANDPIT_WEB_CONCURRENT_CREATES >= 1


def test_a_web_process_fills_its_warm_pool_before_its_first_request(tmp_path: Path) -> None:
    root = jail_root(f"prepare-{os.getpid()}")
    port = free_port()
    env = {
        **os.environ,
        "SANDPIT_PROVIDERS": "local",
        "SANDPIT_LOCAL_ROOT": str(root),
        "SANDPIT_LOCAL_WARM_POOL": "2",
        "SANDPIT_WEB_PROCESSES": "1",
        "DJANGO_SETTINGS_MODULE": "playground.settings",
        "PYTHONPATH": str(ROOT),
    }
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        proc = server_start(port, env, out)
    try:
        ready: list[Path] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            ready = [d for d in root.glob("warm-*") if (d / "state.json").exists()]
            if len(ready) >= 2:
                break
            time.sleep(0.2)
        assert len(ready) >= 2, log.read_text()[-3000:]
        # Nothing was asked of it: the server has served no request yet.
        assert "GET" not in log.read_text() and "POST" not in log.read_text()
        assert httpx.get(f"http://127.0.0.1:{port}/health/live", timeout=5).status_code == 200
    finally:
        proc.terminate()
        proc.wait(20)
    # The unclaimed jails go with the server.
    assert [d for d in root.glob("warm-*") if (d / "state.json").exists()] == []
