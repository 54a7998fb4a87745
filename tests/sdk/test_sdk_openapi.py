"""The SDK and the server's OpenAPI schema cannot drift apart silently: every request the
SDK makes (recorded while it drives a live server) is an operation of the schema with the
fields the schema declares, and every sandbox operation of the schema is either used by the
SDK or listed here as deliberately not covered."""

from __future__ import annotations

import io
import json
import re

import httpx
import pytest

pytestmark = pytest.mark.django_db(transaction=True)

NOT_COVERED = {
    ("get", "/api/v1/sandboxes/{sandbox_id}/terminals/{terminal_id}"): "Terminals.list covers it",
    ("get", "/api/v1/sandboxes/{sandbox_id}/ports"): "the events socket announces ports",
}


def server_schema() -> dict:
    from drf_spectacular.generators import SchemaGenerator

    return SchemaGenerator().get_schema(request=None, public=True)


def _template(path: str, sandbox_id: str) -> str:
    path = path.replace(sandbox_id, "{sandbox_id}")
    path = re.sub(r"/sandboxes/sbx_\w+", "/sandboxes/{sandbox_id}", path)  # forks
    path = re.sub(r"/snapshots/snp_\w+", "/snapshots/{snapshot_id}", path)
    path = re.sub(r"/processes/\d+/", "/processes/{pid}/", path)
    return re.sub(r"/terminals/(term_\w+)", "/terminals/{terminal_id}", path)


def test_sdk_requests_match_the_openapi_schema(client):  # type: ignore[no-untyped-def]
    sent: list[tuple[str, str, dict]] = []
    sandbox_ids: list[str] = []

    def record(request: httpx.Request) -> None:
        body: dict = {}
        if request.headers.get("Content-Type") == "application/json":
            body = json.loads(request.content or b"{}")
        sent.append((request.method.lower(), request.url.path, body))

    client.http.client.event_hooks["request"].append(record)
    client.providers()
    sandbox = client.create(
        provider="local",
        template="default",
        timeout_s=300,
        env={"A": "1"},
        metadata={"m": 1},
        resources={"memory_mb": 256},
        network=False,
    )
    sandbox_ids.append(sandbox.id)
    try:
        sandbox.info()
        client.list(state="running")
        sandbox.stats()
        sandbox.set_timeout(400)
        sandbox.get_url(8000)
        sandbox.commands.run("cat", ["-"], cwd=".", env={"B": "2"}, stdin="x", timeout_s=10)
        sandbox.run_code(
            "print(1)", language="python", stdin="", timeout_s=10, compile_timeout_s=10
        )
        sandbox.languages()
        sandbox.files.write("f.txt", b"data")
        sandbox.files.write("g.txt", io.BytesIO(b"data"), on_progress=lambda d, t: None)
        sandbox.files.read("f.txt")
        sandbox.files.list(".")
        sandbox.files.exists("f.txt")
        sandbox.files.stat("f.txt")
        sandbox.files.make_dir("d")
        sandbox.files.rename("f.txt", "d/f.txt")
        sandbox.files.remove("d", recursive=True)
        process = sandbox.processes.start("sleep", ["100"], cwd=".", env={"C": "3"})
        sandbox.processes.list()
        detached = sandbox.commands.start("echo", ["detached"], cwd=".", env={"E": "5"})
        sandbox.commands.output(detached.pid, stdout_offset=0, stderr_offset=0)
        sandbox.processes.signal(process.pid, "SIGTERM")
        terminal = sandbox.terminals.create(80, 24, shell="/bin/sh", cwd=".", env={"D": "4"})  # noqa: S604
        sandbox.terminals.list()
        sandbox.terminals.resize(terminal.id, 100, 30)
        terminal.close()
        client.run(
            code="print(1)",
            language="python",
            files={"x.txt": "1"},
            stdin="",
            limits={"timeout_s": 5},
        )
        client.run(command="true", provider="local")
        snapshot = sandbox.snapshot("s")
        sandbox.snapshots()
        sandbox.fork().kill()
        client.create(snapshot=snapshot.id).kill()
        client.snapshots()
        client.snapshot_info(snapshot.id)
        client.delete_snapshot(snapshot.id)
        sandbox.pause()
        sandbox.resume()
    finally:
        sandbox.kill()

    schema = server_schema()
    paths = schema["paths"]
    used: set[tuple[str, str]] = set()
    for method, path, body in sent:
        template = _template(path, sandbox_ids[0])
        assert template in paths and method in paths[template], (
            f"{method} {template} is not in the schema"
        )
        used.add((method, template))
        content = paths[template][method].get("requestBody", {}).get("content", {})
        ref = (content.get("application/json") or {}).get("schema", {}).get("$ref")
        if body and ref:
            declared = set(schema["components"]["schemas"][ref.rsplit("/", 1)[-1]]["properties"])
            assert set(body) <= declared, f"{method} {template} sends {set(body) - declared}"

    offered = {
        (method, path)
        for path, operations in paths.items()
        if path.startswith("/api/v1/sandboxes") or path in ("/api/v1/run", "/api/v1/providers")
        for method in operations
        if method in ("get", "post", "put", "delete", "patch")
    }
    assert offered - used == set(NOT_COVERED), "operations the SDK does not cover"
    # Every input field of the main requests is reachable from the SDK (all were passed above).
    for method, template, name in (
        ("post", "/api/v1/sandboxes", "SandboxCreateInput"),
        ("post", "/api/v1/sandboxes/{sandbox_id}/commands", "CommandInput"),
        ("post", "/api/v1/sandboxes/{sandbox_id}/code", "CodeInput"),
        ("post", "/api/v1/sandboxes/{sandbox_id}/processes", "ProcessStartInput"),
        ("post", "/api/v1/sandboxes/{sandbox_id}/terminals", "TerminalCreateInput"),
    ):
        declared = set(schema["components"]["schemas"][name]["properties"])
        keys = set().union(
            *(set(b) for m, p, b in sent if (m, _template(p, sandbox_ids[0])) == (method, template))
        )
        assert declared - keys == set(), f"{name}: the SDK cannot send {declared - keys}"
    run_keys = set().union(*(set(b) for m, p, b in sent if p == "/api/v1/run"))
    assert set(schema["components"]["schemas"]["RunInput"]["properties"]) - run_keys == set()
