"""The README's run command on embedded defaults: SQLite, in-memory layer, filesystem broker."""

from __future__ import annotations

import os
import re
import shutil
import socket
import time
from pathlib import Path

import httpx

from sandboxes.providers.local import volume
from tests.requirements import jail_root
from tests.servers import embedded_env, free_port, jails_destroyed, make_run, manage

ROOT = Path(__file__).resolve().parents[2]


def _wait_for(predicate, timeout_s: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_run_command_serves_login_and_demo_credentials_work(tmp_path):
    port = free_port()
    var_dir = tmp_path / "var"
    jails = jail_root("run-command")  # new and empty: a root holding anything stays on disk
    env = embedded_env(
        var_dir,
        jails,
        # The product's default, which the suite turns off (scripts/test.sh): the web
        # processes and the embedded worker share a root held in memory.
        SANDPIT_LOCAL_ROOT_IN_MEMORY="true",
        SANDPIT_PORT=str(port),
        SANDPIT_REAP_INTERVAL_S="1",
    )
    log = tmp_path / "run.log"
    try:
        with make_run(env, log) as proc:

            def serving() -> bool:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                        return True
                except OSError:
                    assert proc.poll() is None, log.read_text()[-3000:]
                    return False

            _wait_for(serving, 180, "daphne to listen")
            output = log.read_text()
            match = re.search(r"Demo login: (\S+) / (\S+)", output)
            assert match, output[-2000:]
            email, password = match.groups()

            base = f"http://127.0.0.1:{port}"
            browser = httpx.Client(base_url=base, follow_redirects=True, timeout=30)
            page = browser.get("/")  # redirected to the login page
            assert "Log in to Sandpit" in page.text
            landed = browser.post(
                "/accounts/login/",
                data={
                    "username": email,
                    "password": password,
                    "csrfmiddlewaretoken": browser.cookies["csrftoken"],
                },
                headers={"Referer": base + "/accounts/login/"},
            )
            assert str(landed.url).rstrip("/") == base, landed.url
            assert "Sandboxes" in landed.text and email in landed.text

            # The embedded Celery worker and beat work: beat sends the reaper every second through
            # the filesystem broker, and the worker reaps a sandbox whose lifetime has ended.
            secret = manage(env, "create_api_key", "demo", "run-test")
            api = httpx.Client(
                base_url=base, headers={"Authorization": f"Bearer {secret}"}, timeout=30
            )
            sandbox_id = api.post("/api/v1/sandboxes", json={}).json()["id"]
            manage(
                env,
                "shell",
                "-c",
                "from django.utils import timezone; from sandboxes.models import Sandbox; "
                f"Sandbox.objects.filter(pk='{sandbox_id}').update(expires_at=timezone.now())",
            )

            def reaped() -> bool:
                body = api.get(f"/api/v1/sandboxes/{sandbox_id}").json()
                return body["state"] == "destroyed" and body["destroy_reason"] == "max_lifetime"

            _wait_for(reaped, 60, "the embedded worker to reap the sandbox")
            # The worker removes what the web process made, on the one root they share (after
            # the row says destroyed: the provider's part comes second).
            _wait_for(
                lambda: not (jails / sandbox_id).exists(), 30, "the worker to remove the jail"
            )
            if os.geteuid() == 0:
                assert volume.on_tmpfs(jails)
    finally:
        jails_destroyed(jails)
        volume.release_root(jails)
        shutil.rmtree(jails, ignore_errors=True)
