"""What the E2B layer's schema fuzzing found, pinned one case each: a body that is not an
object, a type the document rules out, an unknown list state, an empty X-API-Key beside a
valid token, RPC messages connectrpc cannot decode (INVALID_ARGUMENT, not UNKNOWN's 500),
and streams that end at the client's deadline (Connect-Timeout-Ms)."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
from rest_framework.test import APIClient

from sandboxes.models import Sandbox
from tests.e2bcompat.rpc_calls import envelope, envelopes, rpc

pytestmark = pytest.mark.django_db(transaction=True)
END_OF_STREAM = 0x02


def e2b_client(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_X_API_KEY=key)
    return client


def _assert_e2b_error(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.content
    body = response.json()
    assert body["code"] == status and body["message"]
    assert {"code", "message"} <= set(body["error"])
    return body  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "body",
    [
        b"-238",
        b"[]",
        b'"base"',
        b"null",
        b'{"templateID": 5}',
        b'{"templateID": ["local"]}',
        b'{"templateID": "local", "allow_internet_access": "yes"}',
        b'{"templateID": "local", "allow_internet_access": 1}',
        b'{"templateID": "local", "timeout": true}',
        b'{"templateID": "local", "timeout": "60"}',
        b'{"templateID": "local", "envVars": ["A=1"]}',
    ],
)
def test_a_create_the_document_rules_out_is_400_and_creates_nothing(
    key_a, org_a, local_sandboxes, body
):  # type: ignore[no-untyped-def]
    refused = e2b_client(key_a).post("/e2b/v2/sandboxes", body, content_type="application/json")
    _assert_e2b_error(refused, 400)
    assert not Sandbox.objects.filter(organization=org_a).exists()


def test_timeout_and_connect_refuse_bodies_that_are_not_objects(key_a, local_sandboxes):  # type: ignore[no-untyped-def]
    client = e2b_client(key_a)
    created = client.post("/e2b/v2/sandboxes", {"templateID": "local"}, format="json")
    assert created.status_code == 201, created.content
    sandbox_id = created.json()["sandboxID"]
    for path in (f"/e2b/sandboxes/{sandbox_id}/timeout", f"/e2b/v2/sandboxes/{sandbox_id}/connect"):
        for body in (b"[60]", b"60", b'"x"'):
            _assert_e2b_error(client.post(path, body, content_type="application/json"), 400)
    # The right bodies still work, and null is the installation's default for connect.
    ok = client.post(f"/e2b/sandboxes/{sandbox_id}/timeout", {"timeout": 120}, format="json")
    assert ok.status_code == 204, ok.content
    connected = client.post(
        f"/e2b/v2/sandboxes/{sandbox_id}/connect", {"timeout": None}, format="json"
    )
    assert connected.status_code == 200, connected.content


@pytest.mark.parametrize("state", ["sleeping", "running,gone", "ó𥌇", "RUNNING", ",", "running,"])
def test_listing_by_an_unknown_state_is_400(key_a, state):  # type: ignore[no-untyped-def]
    for path in ("/e2b/sandboxes", "/e2b/v2/sandboxes"):
        _assert_e2b_error(e2b_client(key_a).get(path, {"state": state}), 400)
    listed = e2b_client(key_a).get("/e2b/v2/sandboxes", {"state": "running,paused"})
    assert listed.status_code == 200 and listed.json() == []


def test_an_empty_api_key_beside_a_valid_token_is_refused(key_a, local_sandboxes):  # type: ignore[no-untyped-def]
    """A credential that is present is checked, even empty: the key is read first."""
    created = e2b_client(key_a).post("/e2b/v2/sandboxes", {"templateID": "local"}, format="json")
    sandbox = created.json()
    token = {"HTTP_X_ACCESS_TOKEN": sandbox["envdAccessToken"]}
    envd = {**token, "HTTP_E2B_SANDBOX_ID": sandbox["sandboxID"]}
    assert APIClient().get("/e2b/health", **envd).status_code == 204
    _assert_e2b_error(APIClient().get("/e2b/health", HTTP_X_API_KEY="", **envd), 401)
    _assert_e2b_error(APIClient().get("/e2b/v2/sandboxes", HTTP_X_API_KEY="", **token), 401)
    headers = {
        "X-API-Key": "",
        "X-Access-Token": sandbox["envdAccessToken"],
        "E2b-Sandbox-Id": sandbox["sandboxID"],
    }
    refused = rpc("/filesystem.Filesystem/ListDir", b'{"path": "/home/user"}', headers)
    assert refused.status_code == 401 and refused.json()["code"] == "unauthenticated"
    del headers["X-API-Key"]
    listed = rpc("/filesystem.Filesystem/ListDir", b'{"path": "/home/user"}', headers)
    assert listed.status_code == 200, listed.text


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/process.Process/List", b'"Pm"'),
        ("/process.Process/Update", b"\xff"),
        ("/process.Process/CloseStdin", b'{"process": 1.7976931348623157e+308}'),
        ("/process.Process/SendSignal", b'{"process": {"pid": -2164520}}'),
        ("/process.Process/SendInput", b'{"process": {"pid": 4294967296}}'),
        ("/filesystem.Filesystem/ListDir", b'{"depth": "deep"}'),
        ("/filesystem.Filesystem/Stat", b"[" * 5000 + b"]" * 5000),
        ("/filesystem.Filesystem/Move", b'{"source": {"a": 1}}'),
    ],
)
def test_a_message_that_cannot_be_decoded_is_invalid_argument(key_a, path, body):  # type: ignore[no-untyped-def]
    """The client's bytes, not the server's fault: 400 invalid_argument (connectrpc's own
    answer was 500 unknown), with what was wrong and no traceback."""
    answer = rpc(path, body, {"X-API-Key": key_a, "E2b-Sandbox-Id": "sbx_none"})
    assert answer.status_code == 400, answer.text
    error = answer.json()
    assert error["code"] == "invalid_argument"
    assert error["message"].startswith("cannot read the ") and "Traceback" not in error["message"]


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/process.Process/Start", {"pty": {"size": {"cols": -1364}}}),
        ("/process.Process/Connect", {"process": 1.7976931348623157e308}),
        ("/filesystem.Filesystem/WatchDir", {"recursive": "yes"}),
        ("/filesystem.Filesystem/WatchDir", b"not json"),
    ],
)
def test_a_stream_whose_message_cannot_be_decoded_ends_invalid_argument(key_a, path, message):  # type: ignore[no-untyped-def]
    answer = rpc(
        path,
        envelope(message),
        {"X-API-Key": key_a, "E2b-Sandbox-Id": "sbx_none"},
        stream=True,
    )
    assert answer.status_code == 200, answer.text
    (flags, end), *_ = envelopes(answer.content)[-1:]
    assert flags & END_OF_STREAM
    assert end["error"]["code"] == "invalid_argument", end


def _stream(
    server: Any, path: str, message: dict[str, Any], headers: dict[str, str]
) -> tuple[float, list[tuple[int, Any]]]:
    """(seconds to the stream's end, its envelopes) of a streamed RPC on the live server."""
    started = time.monotonic()
    with httpx.stream(
        "POST",
        f"{server.http}/e2b{path}",
        content=envelope(message),
        headers={
            "Content-Type": "application/connect+json",
            "Connect-Protocol-Version": "1",
            **headers,
        },
        timeout=30,
    ) as response:
        assert response.status_code == 200
        body = response.read()
    return time.monotonic() - started, envelopes(body)


def test_streams_end_at_the_clients_deadline(e2b_env, key_a):  # type: ignore[no-untyped-def]
    """A PTY's output and a watch last as long as the client's deadline says (the SDK's
    `timeout`), then end DEADLINE_EXCEEDED; the PTY goes on, as after a hang-up. A command's
    own timeout still ends it with its end event, not the deadline's error."""
    created = httpx.post(
        f"{e2b_env.http}/e2b/v2/sandboxes",
        json={"templateID": "local"},
        headers={"X-API-Key": key_a},
        timeout=30,
    )
    assert created.status_code == 201, created.text
    sandbox = created.json()
    headers = {
        "X-Access-Token": sandbox["envdAccessToken"],
        "E2b-Sandbox-Id": sandbox["sandboxID"],
        "Connect-Timeout-Ms": "800",
    }
    pty = {"process": {"cmd": "/bin/bash"}, "pty": {"size": {"cols": 80, "rows": 24}}}
    took, events = _stream(e2b_env, "/process.Process/Start", pty, headers)
    flags, end = events[-1]
    assert flags & END_OF_STREAM and end["error"]["code"] == "deadline_exceeded", events
    pid = events[0][1]["event"]["start"]["pid"]
    assert 0.8 <= took < 10
    listed = httpx.post(
        f"{e2b_env.http}/e2b/process.Process/List",
        content=b"{}",
        headers={**headers, "Content-Type": "application/json", "Connect-Protocol-Version": "1"},
        timeout=30,
    )
    assert pid in [p["pid"] for p in listed.json()["processes"]], listed.text

    took, events = _stream(
        e2b_env, "/filesystem.Filesystem/WatchDir", {"path": "/home/user"}, headers
    )
    assert "start" in events[0][1], events
    flags, end = events[-1]
    assert flags & END_OF_STREAM and end["error"]["code"] == "deadline_exceeded", events
    assert 0.8 <= took < 10

    sleeper = {"process": {"cmd": "/bin/sleep", "args": ["30"]}}
    took, events = _stream(e2b_env, "/process.Process/Start", sleeper, headers)
    flags, end = events[-1]
    assert flags & END_OF_STREAM and "error" not in end, events
    ended = events[-2][1]["event"]["end"]
    assert ended["status"] == "timeout" and took < 10, json.dumps(events)
