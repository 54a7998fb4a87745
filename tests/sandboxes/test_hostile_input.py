"""Hostile input to the REST API: every answer is the one JSON error shape with a fitting
4xx status, in development (DEBUG) and production modes alike, never a 500, a traceback or
a host path."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path
from urllib.parse import quote

import pytest
from django.conf import settings as django_settings
from rest_framework.test import APIClient

from sandboxes.models import Sandbox
from tests.conftest import assert_error

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=[True, False], ids=["debug", "production"])
def debug(request, settings):  # type: ignore[no-untyped-def]
    """Both modes: DEBUG=True is where Django shows its technical pages."""
    settings.DEBUG = request.param
    return request.param


def url(sandbox: dict, suffix: str = "") -> str:
    return f"/api/v1/sandboxes/{sandbox['id']}{suffix}"


def assert_clean_error(response, status: int, code: str | None = None) -> dict:  # type: ignore[no-untyped-def]
    """The one error shape, and nothing of a traceback or the host's layout in it."""
    error = assert_error(response, status, code)
    text = response.content.decode("utf-8", "replace")
    for leak in ("Traceback", 'File "/', str(django_settings.SANDPIT_LOCAL_ROOT), "/work/"):
        assert leak not in text, text[:500]
    return error


def post_raw(client: APIClient, path: str, body: bytes) -> object:
    return client.generic("POST", path, body, content_type="application/json")


# --- JSON bodies -----------------------------------------------------------------------------


def test_deeply_nested_json_is_400(api_a, sandbox_a, debug):
    body = b"[" * 100_000 + b"]" * 100_000
    assert_clean_error(post_raw(api_a, url(sandbox_a, "/commands"), body), 400)
    nested = {"command": "true", "env": {}}
    for _ in range(200):
        nested = {"x": nested}
    response = post_raw(api_a, "/api/v1/sandboxes", json.dumps({"metadata": nested}).encode())
    error = assert_clean_error(response, 400)
    assert "nest" in error["message"]


@pytest.mark.parametrize(
    "body",
    [
        b'{"metadata": {"n": 1e999}}',
        b'{"metadata": {"n": -1e400}}',
        b'{"timeout_s": NaN}',
        b'{"metadata": {"n": Infinity}}',
        b'{"metadata": {"n": "\xff"}}',
    ],
)
def test_json_no_handler_can_use_is_400(api_a, key_a, debug, body):  # type: ignore[no-untyped-def]
    """Numbers past a double read as infinity, NaN and Infinity, bytes that are not UTF-8:
    malformed, at the API and on the E2B layer alike (one reader, common.parsers), before any
    sandbox is made."""
    error = assert_clean_error(post_raw(api_a, "/api/v1/sandboxes", body), 400, "malformed_request")
    assert error["message"].startswith("JSON parse error - ")
    e2b = APIClient().generic(
        "POST", "/e2b/v2/sandboxes", body, content_type="application/json", HTTP_X_API_KEY=key_a
    )
    assert e2b.status_code == 400 and e2b.json()["error"]["code"] == "malformed_request"
    assert not Sandbox.objects.exists()


def test_reasonable_nesting_still_parses(api_a, sandbox_a):
    metadata = {"a": {"b": {"c": {"d": [1, [2, [3]]]}}}}
    created = api_a.post("/api/v1/sandboxes", {"metadata": metadata}, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["metadata"] == metadata


def test_json_body_over_the_limit_is_413(api_a, sandbox_a, debug, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 4096
    body = json.dumps({"command": "true", "stdin": "x" * 8192}).encode()
    assert_clean_error(post_raw(api_a, url(sandbox_a, "/commands"), body), 413, "payload_too_large")
    fits = json.dumps({"command": "cat", "stdin": "x" * 1000}).encode()
    response = post_raw(api_a, url(sandbox_a, "/commands"), fits)
    assert response.status_code == 200 and response.json()["stdout"] == "x" * 1000


def test_json_body_over_the_limit_with_idempotency_key_is_413(api_a, sandbox_a, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 4096
    body = json.dumps({"command": "true", "stdin": "x" * 8192}).encode()
    response = api_a.generic(
        "POST",
        url(sandbox_a, "/commands"),
        body,
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY="k1",
    )
    assert_clean_error(response, 413, "payload_too_large")


def test_malformed_json_is_400(api_a, sandbox_a, debug):
    for body in (b"{", b"\xff\xfe", b'{"command": NaN}', b"[]", b"null", b"1e999999"):
        response = post_raw(api_a, url(sandbox_a, "/commands"), body)
        assert_clean_error(response, 400)


@pytest.mark.parametrize(
    ("suffix", "body", "field"),
    [
        ("/commands", {"command": 42}, "command"),
        ("/commands", {"command": True}, "command"),
        ("/commands", {"command": "true", "args": [1]}, "args"),
        ("/commands", {"command": "true", "cwd": 7}, "cwd"),
        ("/commands", {"command": "true", "env": {"A": 1}}, "env"),
        ("/commands", {"command": "true", "stdin": 5}, "stdin"),
        ("/commands", {"command": "true", "timeout_s": "5"}, "timeout_s"),
        ("/code", {"code": 42}, "code"),
        ("/code", {"code": "print(1)", "language": 3}, "language"),
        ("/files/mkdir", {"path": 12}, "path"),
        ("/files/move", {"from": 1, "to": "b"}, "from"),
        ("/processes", {"command": ["sleep", "1"]}, "command"),
        ("/processes/1/signal", {"signal": 9}, "signal"),
        ("/timeout", {"timeout_s": "600"}, "timeout_s"),
        ("/tokens", {"scopes": ["exec"], "ttl_s": "60"}, "ttl_s"),
        ("/terminals", {"cols": "80"}, "cols"),
        ("/terminals", {"shell": ["/bin/sh"]}, "shell"),
    ],
)
def test_wrong_json_types_are_refused_not_coerced(api_a, sandbox_a, suffix, body, field):
    response = api_a.post(url(sandbox_a, suffix), body, format="json")
    error = assert_clean_error(response, 400, "validation_error")
    assert error["message"].startswith(f"{field}:"), error


@pytest.mark.parametrize(
    "body",
    [
        {"network": "yes"},
        {"timeout_s": "600"},
        {"template": 1},
        {"provider": 1},
        {"resources": {"memory_mb": "256"}},
        {"env": {"A": False}},
    ],
)
def test_wrong_json_types_on_create_are_refused(api_a, local_sandboxes, body):
    response = api_a.post("/api/v1/sandboxes", body, format="json")
    error = assert_clean_error(response, 400, "validation_error")
    assert error["message"].startswith(next(iter(body))), error


def test_wrong_json_types_on_run_are_refused(api_a, local_sandboxes):
    for body in (
        {"code": 1},
        {"command": 1},
        {"code": "print(1)", "files": {"a.txt": 1}},
        {"code": "print(1)", "limits": {"timeout_s": "5"}},
    ):
        assert_clean_error(api_a.post("/api/v1/run", body, format="json"), 400, "validation_error")


# --- unknown routes and methods --------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/api/nothing",
        "/api/v1/nothing",
        "/api/v1/sandboxes/",
        "/api/v1/invoices/9b2f6c1e-8f7a-4a51-9d55-0d5a8d3f0a11",
        "/api/v1/invoices/not-a-number/mark-paid",
        "/api/v1/sandboxes/sbx_x/commands/",
        "/api/v2/sandboxes",
    ],
)
def test_unknown_api_path_is_json_404(api_a, debug, path):
    for method in ("get", "post", "delete"):
        response = getattr(api_a, method)(path)
        assert response["Content-Type"].startswith("application/json"), response.content[:200]
        assert_clean_error(response, 404, "not_found")


def test_unknown_api_path_without_credentials_is_json_404(anon_api, debug):
    assert_clean_error(anon_api.get("/api/v1/no-such-thing"), 404, "not_found")


def test_wrong_method_is_json_405(api_a, sandbox_a, debug):
    assert_clean_error(api_a.put(url(sandbox_a, "/commands")), 405, "method_not_allowed")
    assert_clean_error(api_a.patch("/api/v1/sandboxes"), 405, "method_not_allowed")


def test_unhandled_exception_in_an_api_view_is_a_json_500(key_a, sandbox_a, debug, monkeypatch):
    from sandboxes import services

    def explode(**kwargs: object) -> object:
        raise ZeroDivisionError("secret internals /work/main/sandboxes/services.py")

    monkeypatch.setattr(services, "sandbox_exec", explode)
    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key_a}")
    response = client.post(url(sandbox_a, "/commands"), {"command": "true"}, format="json")
    error = assert_clean_error(response, 500, "internal_error")
    assert "secret" not in response.content.decode()
    assert "ZeroDivisionError" not in error["message"]


# --- file paths --------------------------------------------------------------------------------


def test_hostile_query_parameters_are_400(api_a, sandbox_a, debug):
    api_a.put(
        url(sandbox_a, "/files/content?path=f"), data=b"x", content_type="application/octet-stream"
    )
    for query in (
        "path=f&offset=abc",
        "path=f&offset=-1",
        "path=f&offset=1e30",
        f"path=f&offset={2**70}&length=1",
        f"path=f&length={2**70}",
        "path=f&recursive=maybe",
    ):
        assert_clean_error(api_a.get(url(sandbox_a, f"/files/content?{query}")), 400)


def test_path_component_over_255_bytes_is_400(api_a, sandbox_a, debug):
    long = "a" * 256
    for name in (long, f"dir/{long}", f"{long}/x", "é" * 128):
        q = quote(name)
        assert_clean_error(api_a.get(url(sandbox_a, f"/files/content?path={q}")), 400)
        assert_clean_error(api_a.get(url(sandbox_a, f"/files/stat?path={q}")), 400)
        assert_clean_error(api_a.get(url(sandbox_a, f"/files?path={q}")), 400)
        assert_clean_error(api_a.delete(url(sandbox_a, f"/files?path={q}")), 400)
        put = api_a.put(
            url(sandbox_a, f"/files/content?path={q}"),
            data=b"x",
            content_type="application/octet-stream",
        )
        assert_clean_error(put, 400)
        mkdir = api_a.post(url(sandbox_a, "/files/mkdir"), {"path": name}, format="json")
        assert_clean_error(mkdir, 400)
        move = api_a.post(url(sandbox_a, "/files/move"), {"from": name, "to": "b"}, format="json")
        assert_clean_error(move, 400)
    ok = api_a.put(
        url(sandbox_a, "/files/content?path=" + "b" * 255),
        data=b"x",
        content_type="application/octet-stream",
    )
    assert ok.status_code == 201, ok.content


@pytest.mark.parametrize("name", ["a\r\nSet-Cookie: x=1", "line\nfeed", 'quo"te', "naïve ✓.txt"])
def test_download_of_a_name_with_control_characters_has_a_safe_disposition(api_a, sandbox_a, name):
    created = api_a.post(
        url(sandbox_a, "/commands"),
        {"command": 'printf hi > "$NAME"', "env": {"NAME": name}},
        format="json",
    )
    assert created.json()["exit_code"] == 0, created.json()
    response = api_a.get(url(sandbox_a, "/files/content?path=" + quote(name)))
    assert response.status_code == 200, response.content
    assert response.content == b"hi"
    disposition = response["Content-Disposition"]
    assert "\r" not in disposition and "\n" not in disposition
    assert "Set-Cookie" not in response.cookies
    if name.isascii() and name.isprintable():
        assert disposition.startswith("inline; filename=")
    else:
        assert disposition == "inline; filename*=utf-8''" + quote(name)


def _host_workspace(sandbox: dict) -> Path:
    provider_id = Sandbox.objects.get(id=sandbox["id"]).provider_id
    return Path(django_settings.SANDPIT_LOCAL_ROOT) / provider_id / "workspace"


def test_paths_swapped_or_removed_during_file_operations_never_500(api_a, sandbox_a):
    """A racer swaps `d` between a directory, a symlink and nothing while every file
    operation runs on it; each answer is success, 404 or 409 (never a 500 or a host path)."""
    workspace = _host_workspace(sandbox_a)
    (workspace / "other").mkdir()
    (workspace / "other" / "f").write_bytes(b"x")
    stop = threading.Event()
    d = workspace / "d"

    def racer() -> None:
        while not stop.is_set():
            for step in range(4):
                try:
                    if step == 0:
                        d.mkdir()
                        (d / "f").write_bytes(b"data")
                        (d / "sub").mkdir()
                    elif step == 1 or step == 3:
                        if d.is_symlink():
                            d.unlink()
                        else:
                            shutil.rmtree(d)
                    else:
                        os.symlink("other", d)
                except OSError:
                    pass

    thread = threading.Thread(target=racer, daemon=True)
    thread.start()
    calls = [
        ("get", "/files?path=d", None),
        ("get", "/files?path=d&recursive=true", None),
        ("get", "/files/stat?path=d/f", None),
        ("get", "/files/content?path=d/f", None),
        ("put", "/files/content?path=d/g", b"y"),
        ("put", "/files/content?path=d/sub/deeper/h", b"y"),
        ("post", "/files/mkdir", {"path": "d/sub/m"}),
        ("post", "/files/move", {"from": "d/f", "to": "moved"}),
        ("delete", "/files?path=d/sub&recursive=true", None),
        ("delete", "/files?path=d&recursive=true", None),
        ("delete", "/files?path=moved", None),
    ]
    statuses: set[int] = set()
    try:
        for _ in range(60):
            for method, suffix, body in calls:
                if method == "put":
                    response = api_a.put(
                        url(sandbox_a, suffix), data=body, content_type="application/octet-stream"
                    )
                elif body is not None:
                    response = getattr(api_a, method)(url(sandbox_a, suffix), body, format="json")
                else:
                    response = getattr(api_a, method)(url(sandbox_a, suffix))
                statuses.add(response.status_code)
                if response.status_code < 300:
                    continue
                error = assert_clean_error(response, response.status_code)
                assert response.status_code in (404, 409), (method, suffix, error)
    finally:
        stop.set()
        thread.join()
    assert statuses & {404, 409} and statuses & {200, 201, 204}, statuses


def test_file_upload_with_an_idempotency_key(api_a, sandbox_a, debug):
    for size in (10, 3 * 1024 * 1024):
        response = api_a.put(
            url(sandbox_a, f"/files/content?path=f{size}"),
            data=b"z" * size,
            content_type="application/octet-stream",
            HTTP_IDEMPOTENCY_KEY=f"upload-{size}-{debug}",
        )
        assert response.status_code == 201, response.content[:300]
        assert response.json()["size"] == size


def test_refusals_before_any_view_are_json(api_a, sandbox_a, debug):
    """Django refuses an unknown Host before routing; under DEBUG as a technical page."""
    assert_clean_error(api_a.get("/api/v1/sandboxes", HTTP_HOST="evil.example"), 400)
    assert_clean_error(
        api_a.post(url(sandbox_a, "/commands"), {"command": "id"}, HTTP_HOST="evil.example"), 400
    )


def test_nul_bytes_anywhere_are_400(api_a, sandbox_a, debug):
    for path in (
        "/api/v1/sandboxes/%00",
        f"/api/v1/sandboxes/{sandbox_a['id']}%00/stats",
        "/api/v1/sandboxes?state=%00",
        "/api/v1/invoices?status=a%00b",
    ):
        assert_clean_error(api_a.get(path), 400, "malformed_request")
    for body in (
        {"metadata": {"a": "\x00"}},
        {"metadata": {"\x00": 1}},
        {"template": "a\x00"},
    ):
        response = api_a.post("/api/v1/sandboxes", body, format="json")
        assert_clean_error(response, 400, "validation_error")


@pytest.mark.parametrize("pid", ["0", "4194305", "2147483648", "1760625530225656", "9" * 40])
def test_a_process_id_no_process_can_have_is_404(api_a, sandbox_a, debug, pid):
    """Found by the schema fuzzer: a pid past a C int reached the agent, whose kill() raised
    OverflowError, answered 502 provider_error with Python's message."""
    signal = api_a.post(url(sandbox_a, f"/processes/{pid}/signal"), {}, format="json")
    assert_clean_error(signal, 404, "not_found")
    output = api_a.get(url(sandbox_a, f"/processes/{pid}/output"))
    assert_clean_error(output, 404, "not_found")
    # The largest pid Linux has is a pid: no such process here, in the same shape.
    assert_clean_error(
        api_a.post(url(sandbox_a, "/processes/4194304/signal"), {}, format="json"), 404
    )


def test_an_unknown_provider_is_400_at_every_door(api_a, local_sandboxes, debug):
    """Found by the schema fuzzer: a one-shot run naming a provider not enabled here was 503
    provider_not_configured (the server's fault) where a create said 400."""
    for path, body in (
        ("/api/v1/run", {"provider": "nope", "command": "true"}),
        ("/api/v1/sandboxes", {"provider": "nope"}),
    ):
        error = assert_clean_error(api_a.post(path, body, format="json"), 400, "unknown_provider")
        assert "nope" in error["message"]
    assert not Sandbox.objects.exists()


@pytest.mark.parametrize(
    "query",
    [
        "limit=abc",
        "limit=0",
        "limit=-1",
        "limit=1.5",
        "limit=%EF%BC%91",  # a fullwidth digit one: isdigit() says yes, the API says no
        "offset=-84910979",
        "offset=null",
        "offset=" + "9" * 19,  # past a bigint: would fail in the database
        "limit=1&limit=2",
        "format=",
        "format=json&format=json",
        "format=xml",
        "all=maybe",
        "state=sleeping",
    ],
)
def test_list_query_mistakes_are_400_not_the_default_page(api_a, local_sandboxes, debug, query):
    """Found by the schema fuzzer's negative cases: DRF's pagination answered the default
    page for any limit or offset it could not read, and the list read `all` and `state`
    loosely, so a client's typo came back as data (200)."""
    assert_clean_error(api_a.get(f"/api/v1/sandboxes?{query}"), 400)


def test_list_queries_that_are_right_still_page(api_a, local_sandboxes):
    for _ in range(3):
        assert api_a.post("/api/v1/sandboxes", {}, format="json").status_code == 201
    page = api_a.get("/api/v1/sandboxes?limit=2&offset=1&all=false&state=running").json()
    assert page["count"] == 3 and len(page["results"]) == 2 and page["previous"]
    # A limit past the largest page reads as the largest page, as documented.
    assert len(api_a.get("/api/v1/sandboxes?limit=" + "9" * 30).json()["results"]) == 3
    assert api_a.get("/api/v1/snapshots?limit=abc").status_code == 400
    assert api_a.get("/api/v1/invoices?offset=-1").status_code == 400
    # The export's path names its format; a query saying otherwise is a mistake.
    assert api_a.get("/api/v1/usage.csv?format=csv").status_code == 200
    for other in ("json", "M%C3%B6"):
        assert_clean_error(api_a.get(f"/api/v1/usage.csv?format={other}"), 400)
