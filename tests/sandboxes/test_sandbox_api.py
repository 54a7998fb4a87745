"""The sandbox REST API end to end on the real local provider."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import jwt
import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts.authentication import Principal
from accounts.models import Organization
from common.errors import NotFound
from sandboxes import serializers
from sandboxes.models import Sandbox, SandboxState
from sandboxes.provider_access import sandbox_transition
from sandboxes.selectors import sandbox_get_for_principal
from sandboxes.services import CAPPED_STATES, _capped_sql, capped_sandboxes_lock_and_count
from tests.conftest import assert_error

pytestmark = pytest.mark.django_db(transaction=True)


def url(sandbox: dict, suffix: str = "") -> str:
    return f"/api/v1/sandboxes/{sandbox['id']}{suffix}"


def test_create_get_list_destroy(api_a, sandbox_a):
    assert sandbox_a["state"] == "running" and sandbox_a["provider"] == "local"
    assert sandbox_a["id"].startswith("sbx_")
    assert api_a.get(url(sandbox_a)).json()["state"] == "running"
    listed = api_a.get("/api/v1/sandboxes").json()
    assert [s["id"] for s in listed["results"]] == [sandbox_a["id"]] and listed["count"] == 1
    destroyed = api_a.delete(url(sandbox_a))
    assert destroyed.status_code == 200 and destroyed.json()["state"] == "destroyed"
    assert destroyed.json()["destroy_reason"] == "api"
    assert api_a.get("/api/v1/sandboxes").json()["count"] == 0
    after = api_a.post(url(sandbox_a, "/commands"), {"command": "true"}, format="json")
    assert_error(after, 409, "sandbox_not_running")


def test_a_destroy_answers_the_row_it_wrote_without_reading_it_again(api_a, sandbox_a):
    """The winning destroy's answer is the row as it now is (the state change wrote it into
    the request's instance); a destroy that lost (here: the sandbox was gone already) reads
    the row and answers what the winner left."""

    def delete() -> tuple[Any, int]:
        with CaptureQueriesContext(connection) as queries:
            response = api_a.delete(url(sandbox_a))
        return response, sum(
            q["sql"].startswith("SELECT") and '"sandboxes_sandbox"' in q["sql"]
            for q in queries.captured_queries
        )

    won, reads = delete()
    assert won.status_code == 200 and won.json()["state"] == "destroyed", won.content
    assert reads <= 1  # the request's own lookup, before the destroy
    assert won.json() == api_a.get(url(sandbox_a)).json()
    lost, reads = delete()
    assert lost.status_code == 200 and reads >= 1
    assert lost.json() == won.json()


def test_create_validation_errors(api_a, local_sandboxes):
    assert_error(
        api_a.post("/api/v1/sandboxes", {"provider": "nope"}, format="json"),
        400,
        "unknown_provider",
    )
    assert_error(
        api_a.post("/api/v1/sandboxes", {"resources": {"memory_mb": 10**9}}, format="json"),
        400,
        "validation_error",
    )
    assert_error(api_a.post("/api/v1/sandboxes", {"env": {"A=B": "x"}}, format="json"), 400)


def test_network_needs_organization_permission(api_a, local_sandboxes, org_a):
    assert_error(
        api_a.post("/api/v1/sandboxes", {"network": True}, format="json"),
        403,
        "network_not_allowed",
    )


def test_concurrent_sandbox_limit_is_429(api_a, local_sandboxes, org_a):
    Organization.objects.filter(pk=org_a.pk).update(max_concurrent_sandboxes=2)
    for _ in range(2):
        assert api_a.post("/api/v1/sandboxes", {}, format="json").status_code == 201
    error = assert_error(
        api_a.post("/api/v1/sandboxes", {}, format="json"), 429, "sandbox_limit_reached"
    )
    assert "limit 2" in error["message"]


def test_command_shell_args_stdin_cwd_env(api_a, sandbox_a):
    shell = api_a.post(
        url(sandbox_a, "/commands"), {"command": "echo $((6*7)) && echo err >&2"}, format="json"
    ).json()
    assert shell["stdout"] == "42\n" and shell["stderr"] == "err\n" and shell["exit_code"] == 0
    assert shell["timed_out"] is False and shell["truncated"] is False
    direct = api_a.post(
        url(sandbox_a, "/commands"),
        {"command": "printf", "args": ["%s|", "a b", "$HOME"]},
        format="json",
    )
    assert direct.json()["stdout"] == "a b|$HOME|"
    piped = api_a.post(
        url(sandbox_a, "/commands"), {"command": "tr a-z A-Z", "stdin": "hello"}, format="json"
    )
    assert piped.json()["stdout"] == "HELLO"
    api_a.post(url(sandbox_a, "/files/mkdir"), {"path": "sub"}, format="json")
    where = api_a.post(
        url(sandbox_a, "/commands"),
        {"command": "pwd; echo $GREETING", "cwd": "sub", "env": {"GREETING": "hi"}},
        format="json",
    ).json()
    assert where["stdout"].splitlines() == ["/workspace/sub", "hi"]
    failing = api_a.post(url(sandbox_a, "/commands"), {"command": "exit 3"}, format="json")
    assert failing.json()["exit_code"] == 3


def test_command_timeout_kills_the_tree(api_a, sandbox_a):
    response = api_a.post(
        url(sandbox_a, "/commands"),
        {"command": "sleep 100 & sleep 100; echo never", "timeout_s": 0.5},
        format="json",
    ).json()
    assert response["timed_out"] is True and "never" not in response["stdout"]
    ps = api_a.post(url(sandbox_a, "/commands"), {"command": "ps -eo comm"}, format="json").json()
    assert "sleep" not in ps["stdout"]


def test_command_output_is_truncated_with_a_flag(api_a, sandbox_a, settings):
    settings.SANDPIT_MAX_OUTPUT_BYTES = 1000
    response = api_a.post(
        url(sandbox_a, "/commands"), {"command": "yes | head -c 100000"}, format="json"
    ).json()
    assert response["truncated"] is True and len(response["stdout"]) <= 1000


def test_command_validation(api_a, sandbox_a):
    assert_error(
        api_a.post(url(sandbox_a, "/commands"), {}, format="json"), 400, "validation_error"
    )
    assert_error(
        api_a.post(
            url(sandbox_a, "/commands"), {"command": "x", "timeout_s": 10**6}, format="json"
        ),
        400,
    )
    assert_error(api_a.post(url(sandbox_a, "/commands"), {"command": "a\x00b"}, format="json"), 400)


def test_run_code_languages_and_detection(api_a, sandbox_a):
    py = api_a.post(url(sandbox_a, "/code"), {"code": "print(sum(range(10)))"}, format="json")
    assert py.json()["stdout"] == "45\n" and py.json()["language"] == "python"
    node = api_a.post(url(sandbox_a, "/code"), {"code": "console.log(6*7)"}, format="json")
    assert node.json()["stdout"] == "42\n" and node.json()["language"] == "node"
    bash = api_a.post(
        url(sandbox_a, "/code"),
        {"code": "echo $0 | grep -c bash", "language": "bash"},
        format="json",
    )
    assert bash.json()["exit_code"] == 0
    assert_error(
        api_a.post(url(sandbox_a, "/code"), {"code": "x", "language": "cobol"}, format="json"),
        400,
        "unknown_language",
    )


def test_files_round_trip(api_a, sandbox_a):
    payload = bytes(range(256)) * 10
    put = api_a.put(
        url(sandbox_a, "/files/content?path=dir/deep/data.bin"),
        data=payload,
        content_type="application/octet-stream",
    )
    assert put.status_code == 201 and put.json()["size"] == len(payload)
    got = api_a.get(url(sandbox_a, "/files/content?path=dir/deep/data.bin"))
    assert got.status_code == 200 and got.content == payload
    part = api_a.get(url(sandbox_a, "/files/content?path=dir/deep/data.bin&offset=10&length=5"))
    assert part.content == payload[10:15]
    stat = api_a.get(url(sandbox_a, "/files/stat?path=dir/deep/data.bin")).json()
    assert stat["type"] == "file" and stat["size"] == len(payload) and stat["name"] == "data.bin"
    listing = api_a.get(url(sandbox_a, "/files?path=dir&recursive=true")).json()["entries"]
    assert {e["path"] for e in listing} >= {"dir/deep", "dir/deep/data.bin"}
    assert (
        api_a.post(url(sandbox_a, "/files/mkdir"), {"path": "a/b/c"}, format="json").status_code
        == 201
    )
    moved = api_a.post(
        url(sandbox_a, "/files/move"),
        {"from": "dir/deep/data.bin", "to": "a/b/c/moved.bin"},
        format="json",
    )
    assert moved.status_code == 200 and moved.json()["path"] == "a/b/c/moved.bin"
    assert_error(
        api_a.get(url(sandbox_a, "/files/stat?path=dir/deep/data.bin")), 404, "file_not_found"
    )
    assert api_a.delete(url(sandbox_a, "/files?path=a&recursive=true")).status_code == 204
    assert_error(api_a.get(url(sandbox_a, "/files/stat?path=a")), 404)
    seen = api_a.post(url(sandbox_a, "/commands"), {"command": "ls"}, format="json").json()
    assert seen["stdout"].split() == ["dir"]


def test_file_path_attacks_are_refused(api_a, sandbox_a):
    for path in ("../../etc/passwd", "/etc/passwd", "dir/../../x"):
        assert_error(
            api_a.get(url(sandbox_a, f"/files/content?path={path}")), 400, "path_not_allowed"
        )
    api_a.post(url(sandbox_a, "/commands"), {"command": "ln -s /etc escape"}, format="json")
    assert_error(
        api_a.get(url(sandbox_a, "/files/content?path=escape/passwd")), 400, "path_not_allowed"
    )
    assert_error(
        api_a.put(
            url(sandbox_a, "/files/content?path=escape/evil"),
            data=b"x",
            content_type="application/octet-stream",
        ),
        400,
        "path_not_allowed",
    )
    assert_error(api_a.get(url(sandbox_a, "/files/stat?path=a%00b")), 400)
    assert_error(api_a.get(url(sandbox_a, "/files/stat?path=" + "a" * 5000)), 400)


def test_upload_over_the_limit_is_413(api_a, sandbox_a, settings):
    settings.SANDPIT_MAX_FILE_BYTES = 1024
    response = api_a.put(
        url(sandbox_a, "/files/content?path=big"),
        data=b"x" * 2048,
        content_type="application/octet-stream",
    )
    assert_error(response, 413, "file_too_large")


def test_background_processes(api_a, sandbox_a):
    started = api_a.post(url(sandbox_a, "/processes"), {"command": "sleep 60"}, format="json")
    assert started.status_code == 201
    pid = started.json()["pid"]
    listed = api_a.get(url(sandbox_a, "/processes")).json()["results"]
    assert any(p["pid"] == pid and p["running"] for p in listed)
    assert (
        api_a.post(
            url(sandbox_a, f"/processes/{pid}/signal"), {"signal": "SIGKILL"}, format="json"
        ).status_code
        == 200
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        procs = api_a.get(url(sandbox_a, "/processes")).json()["results"]
        if not any(p["pid"] == pid and p["running"] for p in procs):
            break
        time.sleep(0.05)
    else:
        pytest.fail("process still running after SIGKILL")
    assert_error(
        api_a.post(
            url(sandbox_a, f"/processes/{pid}/signal"), {"signal": "SIGNOPE"}, format="json"
        ),
        400,
    )


def test_other_organization_gets_404_everywhere(api_b, sandbox_a):
    calls = [
        ("get", ""),
        ("delete", ""),
        ("get", "/stats"),
        ("post", "/commands"),
        ("post", "/code"),
        ("get", "/files"),
        ("get", "/files/content?path=x"),
        ("get", "/files/stat?path=x"),
        ("post", "/files/mkdir"),
        ("post", "/files/move"),
        ("get", "/processes"),
        ("post", "/timeout"),
        ("post", "/tokens"),
    ]
    bodies = {
        "/commands": {"command": "id"},
        "/code": {"code": "print(1)"},
        "/files/mkdir": {"path": "x"},
        "/files/move": {"from": "a", "to": "b"},
        "/timeout": {"timeout_s": 60},
        "/tokens": {"scopes": ["exec"]},
    }
    for method, suffix in calls:
        response = getattr(api_b, method)(url(sandbox_a, suffix), bodies.get(suffix), format="json")
        assert_error(response, 404, "sandbox_not_found")
    assert api_b.get("/api/v1/sandboxes").json()["count"] == 0
    assert Sandbox.objects.get(pk=sandbox_a["id"]).state == "running"


def test_sandbox_tokens_scope_one_sandbox(api_a, sandbox_a, local_sandboxes):
    other = api_a.post("/api/v1/sandboxes", {}, format="json").json()
    minted = api_a.post(url(sandbox_a, "/tokens"), {"scopes": ["exec"], "ttl_s": 60}, format="json")
    assert minted.status_code == 201
    token = minted.json()["token"]
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    ok = client.post(url(sandbox_a, "/commands"), {"command": "echo ok"}, format="json")
    assert ok.json()["stdout"] == "ok\n"
    assert_error(client.post(url(other, "/commands"), {"command": "id"}, format="json"), 404)
    assert_error(client.get(url(sandbox_a, "/files")), 403, "scope_missing")
    assert_error(client.post("/api/v1/sandboxes", {}, format="json"), 403, "token_not_allowed")
    assert_error(client.post(url(sandbox_a, "/tokens"), {"scopes": ["exec"]}, format="json"), 403)

    def with_token(value: str):  # type: ignore[no-untyped-def]
        c = APIClient()
        c.credentials(HTTP_AUTHORIZATION=f"Bearer {value}")
        return c.post(url(sandbox_a, "/commands"), {"command": "id"}, format="json")

    header, payload, signature = token.split(".")
    assert_error(with_token(f"{header}.{payload}.{signature[:-3]}abc"), 401)
    claims = jwt.decode(token, options={"verify_signature": False})
    assert_error(
        with_token(
            jwt.encode(
                {**claims, "exp": int(time.time()) - 5},
                settings.SANDBOX_TOKEN_SECRET,
                algorithm="HS256",
            )
        ),
        401,
    )
    unsigned = jwt.encode(claims, key=None, algorithm="none")
    assert_error(with_token(unsigned), 401)
    wrong_secret = "a-wrong-secret-of-the-recommended-length-" + "x" * 32
    assert_error(with_token(jwt.encode(claims, wrong_secret, algorithm="HS256")), 401)


def test_one_shot_run_verdicts(api_a, local_sandboxes):
    def run(body: dict) -> dict:
        response = api_a.post("/api/v1/run", body, format="json")
        assert response.status_code == 200, response.content
        return response.json()

    ok = run({"code": "import sys; print(sys.stdin.read().upper())", "stdin": "abc"})
    assert ok["verdict"] == "ok" and ok["stdout"] == "ABC\n"
    assert ok["cpu_time_ms"] is not None and ok["peak_memory_bytes"] is not None
    files = run({"command": "python3 main.py", "files": {"main.py": "print('from file')"}})
    assert files["verdict"] == "ok" and files["stdout"] == "from file\n"
    assert run({"code": "raise SystemExit(2)", "language": "python"})["verdict"] == "runtime_error"
    assert (
        run({"code": "while True: pass", "language": "python", "limits": {"timeout_s": 1}})[
            "verdict"
        ]
        == "timeout"
    )
    assert (
        run(
            {
                "code": "x = bytearray(512 * 1024 * 1024)",
                "language": "python",
                "limits": {"memory_mb": 64},
            }
        )["verdict"]
        == "memory_limit"
    )
    assert Sandbox.objects.filter(state="running").count() == 0
    assert local_sandboxes.list_sandboxes() == []
    assert_error(api_a.post("/api/v1/run", {"code": "1", "command": "x"}, format="json"), 400)


def test_providers_lists_capabilities_and_health(api_a, local_sandboxes):
    providers = api_a.get("/api/v1/providers").json()["results"]
    local = next(p for p in providers if p["name"] == "local")
    assert local["health"]["ok"] is True and "exec" in local["capabilities"]
    assert "run_code" in local["capabilities"]  # built on exec by the services
    assert local["limits"]["max_command_timeout_s"] > 0


def test_idempotency_key_replays_the_first_result(api_a, sandbox_a):
    headers = {"HTTP_IDEMPOTENCY_KEY": "run-123"}
    first = api_a.post(
        url(sandbox_a, "/commands"), {"command": "date +%s%N"}, format="json", **headers
    )
    second = api_a.post(
        url(sandbox_a, "/commands"), {"command": "date +%s%N"}, format="json", **headers
    )
    assert first.status_code == second.status_code == 200
    assert first.json()["stdout"] == second.json()["stdout"]
    assert second["Idempotent-Replayed"] == "true"


def test_the_sandbox_lookup_reads_what_the_orm_reads(api_a, api_b, sandbox_a, org_a, org_b):
    """sandbox_get_for_principal writes its statement once (sandboxes/selectors.py): the
    same row, field by field, as the ORM's lookup, and the same response as a new
    serializer; another organization's id is a miss."""
    expected = Sandbox.objects.get(pk=sandbox_a["id"], organization=org_a)
    for with_organization in (True, False):
        principal = Principal(organization_id=org_a.pk)
        with CaptureQueriesContext(connection) as queries:
            found = sandbox_get_for_principal(
                principal=principal,
                sandbox_id=sandbox_a["id"],
                with_organization=with_organization,
            )
            assert principal.organization.pk == org_a.pk
        # One statement with the organization joined, else a query of its own on first use.
        assert len(queries) == (1 if with_organization else 2)
        for field in Sandbox._meta.concrete_fields:
            assert getattr(found, field.attname) == getattr(expected, field.attname), field.name
        assert found._state.adding is False and found._state.db == "default"
    read = api_a.get(url(sandbox_a))
    assert read.json() == serializers.SandboxOutput(expected).data
    # Rendered in the view's thread (SandboxApi.finalize_response), DRF's headers kept.
    assert read["Content-Type"] == "application/json"
    assert set(read["Allow"].replace(" ", "").split(",")) >= {"GET", "DELETE"}
    with pytest.raises(NotFound):
        sandbox_get_for_principal(
            principal=Principal(organization=org_b), sandbox_id=sandbox_a["id"]
        )
    assert_error(api_b.get(url(sandbox_a)), 404, "sandbox_not_found")


def test_the_create_limit_counts_what_the_orm_counts(org_a, org_b):
    """capped_sandboxes_lock_and_count writes its statements once (sandboxes/services.py):
    the same count as the ORM's over every state, only the organization's, and the row
    lock on PostgreSQL."""
    row = {"provider": "local", "timeout_s": 60, "expires_at": timezone.now()}
    for state in SandboxState.values:
        Sandbox.objects.create(organization=org_a, state=state, **row)
    Sandbox.objects.create(organization=org_b, state=SandboxState.RUNNING, **row)
    with transaction.atomic():
        live = capped_sandboxes_lock_and_count(org_a.pk)
    assert live == Sandbox.objects.filter(organization=org_a, state__in=CAPPED_STATES).count()
    assert 0 < live < len(SandboxState.values)
    with transaction.atomic():
        assert capped_sandboxes_lock_and_count(org_b.pk) == 1
    lock, _ = _capped_sql()
    assert lock.endswith(" FOR UPDATE") == connection.features.has_select_for_update


def test_a_state_transition_writes_what_the_orm_writes(org_a):
    """sandbox_transition's UPDATE is written once per set of fields
    (sandboxes/provider_access.py): the same row as the ORM's update for the same change,
    refused from a state that does not lead there; a condition (`where`) still applies."""
    row = {"provider": "local", "timeout_s": 60, "expires_at": timezone.now()}
    fast, orm = (Sandbox.objects.create(organization=org_a, **row) for _ in range(2))
    now = timezone.now()
    change: dict[str, Any] = {
        "provider_id": "p-1",
        "engine": "",
        "started_at": now,
        "last_activity_at": now,
    }
    assert sandbox_transition(fast, SandboxState.RUNNING, **change)
    Sandbox.objects.filter(pk=orm.pk).update(state=SandboxState.RUNNING, **change)
    fast_row, orm_row = Sandbox.objects.get(pk=fast.pk), Sandbox.objects.get(pk=orm.pk)
    for field in Sandbox._meta.concrete_fields:
        if field.name not in ("id", "created_at"):
            assert getattr(fast_row, field.attname) == getattr(orm_row, field.attname), field.name
    assert fast.state == fast_row.state == SandboxState.RUNNING and fast.provider_id == "p-1"
    assert not sandbox_transition(fast, SandboxState.RUNNING, provider_id="p-2")
    assert not sandbox_transition(
        fast, SandboxState.STOPPED, where={"last_activity_at": now - timedelta(seconds=1)}
    )
    assert sandbox_transition(fast, SandboxState.ERROR, error_message="gone", stopped_at=now)
    fast_row.refresh_from_db()
    assert (fast_row.state, fast_row.error_message, fast_row.stopped_at) == ("error", "gone", now)
    assert fast_row.provider_id == "p-1"
