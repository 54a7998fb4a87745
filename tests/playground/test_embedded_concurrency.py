"""The embedded mode (SQLite, no Redis) under concurrent requests: the whole ASGI stack
(request threads of playground/webthreads.py), run in a fresh process on its own SQLite
file, creates, reads and destroys sandboxes eight at a time without a database error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.requirements import jail_root

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import asyncio, json, django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from accounts.models import Organization
from accounts.services import api_key_create
from asgiref.testing import ApplicationCommunicator
from playground.asgi import application
from django.db import connection
assert connection.vendor == "sqlite"

org = Organization.objects.create(name="Embedded", slug="embedded", plan="premium")
key = api_key_create(organization=org, name="k").secret

async def call(method, path, body=b""):
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1),
             "server": ("testserver", 80),
             "headers": [(b"host", b"testserver"), (b"authorization", f"Bearer {key}".encode()),
                         (b"content-type", b"application/json")]}
    comm = ApplicationCommunicator(application, scope)
    await comm.send_input({"type": "http.request", "body": body})
    start = await comm.receive_output(60)
    chunks = []
    while True:
        message = await comm.receive_output(60)
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return start["status"], b"".join(chunks)

async def main():
    body = json.dumps({"provider": "local"}).encode()
    created = await asyncio.gather(*[call("POST", "/api/v1/sandboxes", body) for _ in range(4)],
                                   *[call("GET", "/api/v1/sandboxes") for _ in range(4)])
    ids = [json.loads(b)["id"] for s, b in created[:4] if s == 201]
    reads = await asyncio.gather(*[call("GET", f"/api/v1/sandboxes/{i}") for i in ids])
    gone = await asyncio.gather(*[call("DELETE", f"/api/v1/sandboxes/{i}") for i in ids])
    return {"created": [s for s, _ in created[:4]], "listed": [s for s, _ in created[4:]],
            "errors": [b.decode()[:300] for s, b in created if s >= 400],
            "read": [s for s, _ in reads], "deleted": [s for s, _ in gone]}

print("RESULT " + json.dumps(asyncio.run(main())))
"""


def test_concurrent_requests_on_sqlite(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")} | {
        "DJANGO_SETTINGS_MODULE": "playground.settings",
        "SANDPIT_VAR_DIR": str(tmp_path),
        "SANDPIT_SQLITE_PATH": str(tmp_path / "db.sqlite3"),
        "SANDPIT_PROVIDERS": "local",
        "SANDPIT_DEFAULT_PROVIDER": "local",
        "SANDPIT_LOCAL_ROOT": str(jail_root("embedded")),
        "SANDPIT_LOCAL_WARM_POOL": "0",
        "SANDPIT_API_RATE": "100000/min",
        "DJANGO_DEBUG": "false",
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, timeout=300
    )
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    result = json.loads(out.split("RESULT ", 1)[1])
    assert result["created"] == [201] * 4, result
    assert result["listed"] == [200] * 4, result
    assert result["read"] == [200] * 4, result
    assert result["deleted"] == [200] * 4, result
