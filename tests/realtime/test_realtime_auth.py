"""Who may open a socket: API keys, sandbox tokens, sessions; Origin, tenancy, scope, billing."""

from __future__ import annotations

import base64
import json
import time

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.test import Client
from websockets.exceptions import ConnectionClosed, InvalidStatus

from accounts.models import Membership, Organization, Role
from accounts.services import api_key_create
from accounts.tokens import sandbox_token_encode

from .conftest import Api, create_sandbox, open_terminal, recv_json

pytestmark = pytest.mark.django_db(transaction=True)


def _close_code(ws) -> int:  # type: ignore[no-untyped-def]
    """Read until the server closes; the close code it sent."""
    with pytest.raises(ConnectionClosed) as closed:
        for _ in range(20):
            ws.recv(timeout=10)
    return closed.value.rcvd.code  # type: ignore[union-attr]


def _token(api: Api, sandbox_id: str, scopes: list[str]) -> str:
    response = api.post(f"/api/v1/sandboxes/{sandbox_id}/tokens", json={"scopes": scopes})
    assert response.status_code == 201, response.text
    return response.json()["token"]


def _alg_none(token: str) -> str:
    _, payload, _ = token.split(".")
    header = base64.urlsafe_b64encode(json.dumps({"alg": "none", "typ": "JWT"}).encode())
    return header.decode().rstrip("=") + "." + payload + "."


def test_sandbox_token_is_checked_for_sandbox_scope_expiry_and_signature(
    server, rt_api_a, sbx_a, org_a
):  # type: ignore[no-untyped-def]
    other = create_sandbox(rt_api_a)
    terminal_b = open_terminal(rt_api_a, other)
    terminal_a = open_terminal(rt_api_a, sbx_a)
    token_a = _token(rt_api_a, sbx_a, ["terminal"])

    # A token for sandbox A opens A's terminal...
    with server.ws(f"{terminal_a['ws_path']}?token={token_a}") as ws:
        assert isinstance(ws.recv(timeout=10), bytes)
    # ...but not sandbox B's: the miss looks like any other (4404, never 403).
    with server.ws(f"{terminal_b['ws_path']}?token={token_a}") as ws:
        assert _close_code(ws) == 4404

    files_only = _token(rt_api_a, sbx_a, ["files"])
    with server.ws(f"{terminal_a['ws_path']}?token={files_only}") as ws:
        assert _close_code(ws) == 4403

    expired, _ = sandbox_token_encode(
        sandbox_id=sbx_a, organization_id=org_a.pk, scopes=["terminal"], ttl_s=-5
    )
    head, body, signature = token_a.split(".")
    tampered = f"{head}.{body}.{signature[:-4]}{'AAAA' if signature[-4:] != 'AAAA' else 'BBBB'}"
    for bad in (expired, tampered, _alg_none(token_a), "not-a-token"):
        with server.ws(f"{terminal_a['ws_path']}?token={bad}") as ws:
            assert _close_code(ws) == 4401, bad
    rt_api_a.delete(f"/api/v1/sandboxes/{other}")


def test_other_organization_gets_404_and_4404(server, rt_api_a, rt_api_b, key_b, sbx_a):  # type: ignore[no-untyped-def]
    terminal = open_terminal(rt_api_a, sbx_a)
    assert rt_api_b.get(f"/api/v1/sandboxes/{sbx_a}/terminals").status_code == 404
    assert rt_api_b.post(f"/api/v1/sandboxes/{sbx_a}/terminals", json={}).status_code == 404
    assert (
        rt_api_b.delete(f"/api/v1/sandboxes/{sbx_a}/terminals/{terminal['id']}").status_code == 404
    )
    for path in (
        terminal["ws_path"],
        f"/ws/sandboxes/{sbx_a}/events",
        f"/ws/sandboxes/{sbx_a}/exec",
    ):
        with server.ws(path, key=key_b) as ws:
            assert _close_code(ws) == 4404, path


def test_unauthenticated_gets_401_and_4401(server, rt_api_a, sbx_a):  # type: ignore[no-untyped-def]
    terminal = open_terminal(rt_api_a, sbx_a)
    anonymous = Api(server, "sp_wrong").client
    anonymous.headers.pop("Authorization")
    assert anonymous.get(f"/api/v1/sandboxes/{sbx_a}/terminals").status_code in (401, 403)
    with server.ws(terminal["ws_path"]) as ws:
        assert _close_code(ws) == 4401
    with server.ws(terminal["ws_path"], key="sp_" + "x" * 40) as ws:
        assert _close_code(ws) == 4401


def test_socket_from_a_foreign_origin_is_refused(server, rt_api_a, key_a, sbx_a):  # type: ignore[no-untyped-def]
    terminal = open_terminal(rt_api_a, sbx_a)
    with pytest.raises(InvalidStatus) as refused:
        server.ws(terminal["ws_path"], key=key_a, origin="http://evil.example")
    assert refused.value.response.status_code == 403


def test_foreign_origin_and_missing_credentials_with_communicator(transactional_db):  # type: ignore[no-untyped-def]
    from playground.asgi import application

    async def run() -> tuple[bool, bool, dict]:
        foreign = WebsocketCommunicator(
            application, "/ws/sandboxes/sbx_x/events", headers=[(b"origin", b"http://evil.example")]
        )
        refused, _ = await foreign.connect()
        same = WebsocketCommunicator(
            application, "/ws/sandboxes/sbx_x/events", headers=[(b"origin", b"http://localhost")]
        )
        accepted, _ = await same.connect()
        error = await same.receive_json_from()
        closed = await same.receive_output()
        await same.disconnect()
        return refused, accepted, {**error, "close": closed.get("code")}

    refused, accepted, error = async_to_sync(run)()
    assert refused is False
    assert accepted is True and error["code"] == "authentication_failed" and error["close"] == 4401


def test_browser_session_opens_the_events_socket(server, rt_api_a, sbx_a, alice, org_a):  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(alice)
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    with server.ws(f"/ws/sandboxes/{sbx_a}/events", headers={"Cookie": cookie}) as ws:
        ready = recv_json(ws, "ready")
        assert ready["sandbox"] == sbx_a and "files" in ready["signals"]
    # The same session from another site's page is refused by the Origin check.
    with pytest.raises(InvalidStatus):
        server.ws(
            f"/ws/sandboxes/{sbx_a}/events",
            headers={"Cookie": cookie},
            origin="http://evil.example",
        )


@pytest.fixture
def free_key(db, charlie) -> str:  # type: ignore[no-untyped-def]
    org = Organization.objects.create(name="Free org", slug="free-org", plan="free")
    Membership.objects.create(user=charlie, organization=org, role=Role.OWNER)
    return api_key_create(organization=org, name="free", created_by=charlie).secret


def test_free_plan_gets_402_for_terminals_watchers_and_ports(server, free_key):  # type: ignore[no-untyped-def]
    api = Api(server, free_key)
    sandbox_id = create_sandbox(api)
    response = api.post(f"/api/v1/sandboxes/{sandbox_id}/terminals", json={})
    assert response.status_code == 402, response.text
    assert response.json()["error"]["code"] == "premium_required"
    assert api.get(f"/api/v1/sandboxes/{sandbox_id}/ports").status_code == 402
    with server.ws(f"/ws/sandboxes/{sandbox_id}/terminals/term_x", key=free_key) as ws:
        assert _close_code(ws) == 4402
    with server.ws(f"/ws/sandboxes/{sandbox_id}/events", key=free_key) as ws:
        ready = recv_json(ws, "ready")
        assert "ports" not in ready["signals"]
        ws.send(json.dumps({"type": "watch", "path": "."}))
        error = recv_json(ws, "error")
        assert error["code"] == "premium_required" and error["status"] == 402
    preview = api.get(f"/sandboxes/{sandbox_id}/ports/8000/")
    assert preview.status_code == 402
    started = time.monotonic()
    api.delete(f"/api/v1/sandboxes/{sandbox_id}")
    assert time.monotonic() - started < 10


def test_program_without_origin_authenticates_with_its_key(server, rt_api_a, key_a, sbx_a):  # type: ignore[no-untyped-def]
    from websockets.sync.client import connect

    terminal = open_terminal(rt_api_a, sbx_a)
    url = f"ws://127.0.0.1:{server.port}{terminal['ws_path']}"
    with connect(
        url, additional_headers={"Authorization": f"Bearer {key_a}"}, open_timeout=10
    ) as ws:
        ws.send(b"echo no-origin-ok\r")
        seen = b""
        deadline = time.monotonic() + 10
        while b"no-origin-ok\r\n" not in seen and time.monotonic() < deadline:
            frame = ws.recv(timeout=5)
            if isinstance(frame, bytes):
                seen += frame
        assert b"no-origin-ok\r\n" in seen
    # Without credentials a missing Origin does not help: authentication still refuses it.
    with connect(url, open_timeout=10) as ws:
        assert _close_code(ws) == 4401
