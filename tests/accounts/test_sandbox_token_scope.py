"""Sandbox tokens reach their own sandbox's endpoints that their scopes allow, and nothing
else; and they die with the key or member that minted them.

The route walk below covers every URL under /api/, so an endpoint added later is refused
to tokens unless its view lists the method in `sandbox_token_methods` (and then the table
here has to change with it, which makes letting tokens in a reviewed decision).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.testing import HttpCommunicator, WebsocketCommunicator
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, resolve
from rest_framework.test import APIClient

from accounts import authentication
from accounts.models import ApiKey, Membership
from accounts.tokens import TOKEN_SCOPES, sandbox_token_encode
from tests.conftest import assert_error

pytestmark = pytest.mark.django_db(transaction=True)

# Every (view, method) a sandbox token may call, and the scope it needs (None: any token of
# that sandbox). Everything else under /api/ answers 403 or 404 to a token.
TOKEN_ALLOWED: dict[tuple[str, str], str | None] = {
    ("SandboxDetailApi", "GET"): None,
    ("SandboxStatsApi", "GET"): None,
    ("SandboxCommandApi", "POST"): "exec",
    ("SandboxCodeApi", "POST"): "exec",
    ("SandboxLanguagesApi", "GET"): "exec",
    ("ProcessListApi", "GET"): "exec",
    ("ProcessListApi", "POST"): "exec",
    ("ProcessSignalApi", "POST"): "exec",
    ("ProcessOutputApi", "GET"): "exec",
    ("FilesApi", "GET"): "files",
    ("FilesApi", "DELETE"): "files",
    ("FileContentApi", "GET"): "files",
    ("FileContentApi", "PUT"): "files",
    ("FileStatApi", "GET"): "files",
    ("FileExistsApi", "GET"): "files",
    ("MkdirApi", "POST"): "files",
    ("MoveApi", "POST"): "files",
    ("TerminalListApi", "GET"): "terminal",
    ("TerminalListApi", "POST"): "terminal",
    ("TerminalDetailApi", "GET"): "terminal",
    ("TerminalDetailApi", "DELETE"): "terminal",
    ("TerminalResizeApi", "POST"): "terminal",
    ("PortListApi", "GET"): "ports",
}

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
GATE_REFUSALS = {(403, "token_not_allowed"), (403, "scope_missing"), (404, "sandbox_not_found")}


def _api_routes() -> Iterator[tuple[str, Any]]:
    """(route with converters, callback) for every URL pattern under api/."""

    def walk(patterns: list[Any], prefix: str) -> Iterator[tuple[str, Any]]:
        for entry in patterns:
            piece = str(entry.pattern).lstrip("^").rstrip("$")
            if isinstance(entry, URLResolver):
                yield from walk(entry.url_patterns, prefix + piece)
            elif isinstance(entry, URLPattern):
                yield prefix + piece, entry.callback

    return ((r, cb) for r, cb in walk(get_resolver().url_patterns, "") if r.startswith("api/"))


def _concrete(route: str, sandbox_id: str) -> str:
    """A path matching `route`, with `sandbox_id` for the sandbox and samples elsewhere."""

    def sample(match: re.Match[str]) -> str:
        converter, name = match["converter"] or "str", match["name"]
        if name == "sandbox_id":
            return sandbox_id
        return "1" if converter in ("int", "pid") else "x"

    path = re.sub(r"<(?:(?P<converter>\w+):)?(?P<name>\w+)>", sample, route)
    path = re.sub(r"\(\?P<(?P<name>\w+)>[^)]*\)", lambda m: sample(m), path)
    return "/" + path.replace(".*", "x").replace("\\", "")


def _view_methods(callback: Any) -> list[str]:
    view_class = getattr(callback, "view_class", None)
    if view_class is None:  # a function view: whatever it is, a token must not get through
        return ["GET", "POST"]
    methods = [m for m in METHODS if hasattr(view_class, m.lower())]
    if "GET" in methods and "HEAD" not in methods:
        methods.append("HEAD")  # Django's View answers HEAD with get()
    return methods


def _request(client: APIClient, method: str, path: str) -> Any:
    return client.generic(method, path, data="{}", content_type="application/json")


def _code(response: Any) -> str | None:
    try:
        return response.json()["error"]["code"]
    except Exception:  # noqa: BLE001 - HEAD has no body, CSV is not JSON
        return None


def _token_client(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def _mint(api: APIClient, sandbox_id: str, scopes: list[str], ttl_s: int = 600) -> str:
    minted = api.post(
        f"/api/v1/sandboxes/{sandbox_id}/tokens", {"scopes": scopes, "ttl_s": ttl_s}, format="json"
    )
    assert minted.status_code == 201, minted.content
    return minted.json()["token"]


@pytest.fixture(autouse=True)
def _fresh_minter_cache() -> Iterator[None]:
    authentication.minter_cache_clear()
    yield
    authentication.minter_cache_clear()


@pytest.fixture
def sandbox_b(api_a, local_sandboxes) -> dict:  # type: ignore[no-untyped-def]
    """Another sandbox of the same organization."""
    response = api_a.post("/api/v1/sandboxes", {}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def test_views_mark_exactly_the_token_endpoints_of_the_table():
    declared: dict[tuple[str, str], str | None] = {}
    for _, callback in _api_routes():
        view_class = getattr(callback, "view_class", None)
        for method in getattr(view_class, "sandbox_token_methods", ()):
            declared[(view_class.__name__, method)] = getattr(view_class, "required_scope", None)
    assert declared == TOKEN_ALLOWED


def test_every_api_route_refuses_a_token_except_its_own_sandboxs_marked_ones(
    api_a, sandbox_a, sandbox_b
):  # type: ignore[no-untyped-def]
    client = _token_client(_mint(api_a, sandbox_a["id"], list(TOKEN_SCOPES)))
    routes = list(_api_routes())
    assert len(routes) > 30  # the walk found the API, not an empty list
    checked = 0
    for route, callback in routes:
        for sandbox_id in (sandbox_a["id"], sandbox_b["id"]):
            path = _concrete(route, sandbox_id)
            assert resolve(path).func is callback, f"cannot build a path for {route}"
            view = getattr(callback, "view_class", callback).__name__
            for method in _view_methods(callback):
                response = _request(client, method, path)
                where = f"{method} {path} ({view})"
                own = sandbox_id == sandbox_a["id"] and "<str:sandbox_id>" in route
                if own and (view, method) in TOKEN_ALLOWED:
                    assert response.status_code not in (401, 500), where
                    assert (response.status_code, _code(response)) not in GATE_REFUSALS, where
                else:
                    assert response.status_code in (403, 404), (where, response.content[:300])
                    # The gate's own answer on DRF views (HEAD has no body, the schema is
                    # YAML); plain Django views (the JSON 404 for unknown paths) never
                    # authenticate tokens at all.
                    if _code(response) is not None and hasattr(callback, "cls"):
                        assert (response.status_code, _code(response)) in GATE_REFUSALS, where
                checked += 1
    assert checked > 100
    # Nothing a refused call could have done happened: the sandboxes still run.
    assert api_a.get(f"/api/v1/sandboxes/{sandbox_b['id']}").json()["state"] == "running"
    assert api_a.get(f"/api/v1/sandboxes/{sandbox_a['id']}").json()["state"] == "running"


def test_a_terminal_token_gets_403_from_every_organization_wide_read(api_a, sandbox_a):  # type: ignore[no-untyped-def]
    client = _token_client(_mint(api_a, sandbox_a["id"], ["terminal"]))
    for path in (
        "/api/v1/sandboxes",
        "/api/v1/organization",
        "/api/v1/usage",
        "/api/v1/usage.csv",
        "/api/v1/invoices",
        "/api/v1/invoices/upcoming",
        "/api/v1/billing/plan",
        "/api/v1/providers",
        "/api/v1/members",
    ):
        assert_error(client.get(path), 403, "token_not_allowed")
    before = api_a.get(f"/api/v1/sandboxes/{sandbox_a['id']}").json()["expires_at"]
    timeout = client.post(
        f"/api/v1/sandboxes/{sandbox_a['id']}/timeout", {"timeout_s": 86400}, format="json"
    )
    assert_error(timeout, 403, "token_not_allowed")
    assert api_a.get(f"/api/v1/sandboxes/{sandbox_a['id']}").json()["expires_at"] == before
    # Its own sandbox's terminal endpoints still work.
    assert client.get(f"/api/v1/sandboxes/{sandbox_a['id']}/terminals").status_code == 200


def test_a_token_lacking_the_scope_is_refused_on_each_scoped_endpoint(api_a, sandbox_a):  # type: ignore[no-untyped-def]
    for scope in TOKEN_SCOPES:
        others = [s for s in TOKEN_SCOPES if s != scope]
        client = _token_client(_mint(api_a, sandbox_a["id"], others))
        for route, callback in _api_routes():
            view = getattr(callback, "view_class", callback).__name__
            for method in _view_methods(callback):
                if TOKEN_ALLOWED.get((view, method), "") != scope:
                    continue
                response = _request(client, method, _concrete(route, sandbox_a["id"]))
                assert_error(response, 403, "scope_missing")


def _poll_until(check: Any, *, within_s: float) -> float:
    """Seconds until check() is true; fails after within_s."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < within_s, "still accepted"
        time.sleep(0.1)
    return time.monotonic() - started


# Revocation is checked against the database at most MINTER_RECHECK_S after the last check.
ENDS_WITHIN_S = authentication.MINTER_RECHECK_S + 2


def test_revoking_the_key_ends_the_tokens_it_minted(api_a, sandbox_a, alice):  # type: ignore[no-untyped-def]
    token = _mint(api_a, sandbox_a["id"], ["exec"])
    client = _token_client(token)
    command = f"/api/v1/sandboxes/{sandbox_a['id']}/commands"
    assert client.post(command, {"command": "true"}, format="json").status_code == 200

    owner = APIClient()
    owner.force_login(alice)
    key = ApiKey.objects.get()
    assert owner.delete(f"/api/v1/api-keys/{key.pk}").status_code == 200

    def refused() -> bool:
        response = client.post(command, {"command": "true"}, format="json")
        return response.status_code == 401

    _poll_until(refused, within_s=ENDS_WITHIN_S)
    assert_error(client.get(f"/api/v1/sandboxes/{sandbox_a['id']}"), 401)


def test_an_expired_key_ends_its_tokens(api_a, sandbox_a):  # type: ignore[no-untyped-def]
    from django.utils import timezone

    client = _token_client(_mint(api_a, sandbox_a["id"], ["exec"]))
    ApiKey.objects.update(expires_at=timezone.now())
    authentication.minter_cache_clear()
    assert_error(client.get(f"/api/v1/sandboxes/{sandbox_a['id']}"), 401)


def test_removing_the_member_or_deactivating_the_user_ends_their_tokens(
    sandbox_a, alice, bob, org_a
):  # type: ignore[no-untyped-def]
    member = APIClient()
    member.force_login(bob)
    detail = f"/api/v1/sandboxes/{sandbox_a['id']}"
    bobs = _token_client(_mint(member, sandbox_a["id"], ["files"]))
    assert bobs.get(detail).status_code == 200

    owner = APIClient()
    owner.force_login(alice)
    alices = _token_client(_mint(owner, sandbox_a["id"], ["files"]))
    membership = Membership.objects.get(user=bob, organization=org_a)
    assert owner.delete(f"/api/v1/members/{membership.pk}").status_code == 204
    _poll_until(lambda: bobs.get(detail).status_code == 401, within_s=ENDS_WITHIN_S)
    assert alices.get(detail).status_code == 200  # only the removed member's tokens end

    alice.is_active = False
    alice.save(update_fields=["is_active"])
    _poll_until(lambda: alices.get(detail).status_code == 401, within_s=ENDS_WITHIN_S)


def test_a_token_that_names_no_minter_is_refused(sandbox_a, org_a):  # type: ignore[no-untyped-def]
    orphan, _ = sandbox_token_encode(
        sandbox_id=sandbox_a["id"], organization_id=org_a.pk, scopes=["exec"], ttl_s=600
    )
    assert_error(_token_client(orphan).get(f"/api/v1/sandboxes/{sandbox_a['id']}"), 401)


def test_a_token_minted_by_another_organizations_key_is_refused(sandbox_a, org_a, org_b, key_b):  # type: ignore[no-untyped-def]
    """A forged org claim next to a real key of another organization gains nothing."""
    other_key = ApiKey.objects.get(organization=org_b)
    forged, _ = sandbox_token_encode(
        sandbox_id=sandbox_a["id"],
        organization_id=org_a.pk,
        scopes=["exec"],
        ttl_s=600,
        api_key_id=other_key.pk,
    )
    assert_error(_token_client(forged).get(f"/api/v1/sandboxes/{sandbox_a['id']}"), 401)


# --- WebSocket routes and the preview proxy ---------------------------------------------------

HOST = "testserver"
ORIGIN = f"http://{HOST}"


def _ws_close(path: str) -> tuple[bool, int | None]:
    """Connect in process: (accepted, close code), or (True, None) once the events socket
    says it is ready."""

    async def run() -> tuple[bool, int | None]:
        from playground.asgi import application

        communicator = WebsocketCommunicator(
            application, path, headers=[(b"host", HOST.encode()), (b"origin", ORIGIN.encode())]
        )
        accepted, code = await communicator.connect(timeout=10)
        if not accepted:
            return False, code
        try:
            while True:
                output = await communicator.receive_output(timeout=10)
                if output["type"] == "websocket.close":
                    return True, output.get("code")
                if '"ready"' in (output.get("text") or ""):
                    return True, None
        finally:
            await communicator.disconnect()

    return async_to_sync(run)()


def _preview_status(path: str) -> int:
    async def run() -> int:
        from playground.asgi import application

        communicator = HttpCommunicator(
            application, "GET", path, headers=[(b"host", HOST.encode())]
        )
        response = await communicator.get_response(timeout=30)
        return response["status"]

    return async_to_sync(run)()


def _ws_routes(sandbox_id: str) -> dict[str, str | None]:
    """A path per WebSocket route and the scope a token needs there."""
    from sandboxes.routing import websocket_urlpatterns

    known = {
        "ws/sandboxes/<str:sandbox_id>/terminals/<str:terminal_id>": (
            f"/ws/sandboxes/{sandbox_id}/terminals/term_x",
            "terminal",
        ),
        "ws/sandboxes/<str:sandbox_id>/events": (f"/ws/sandboxes/{sandbox_id}/events", None),
        "ws/sandboxes/<str:sandbox_id>/exec": (f"/ws/sandboxes/{sandbox_id}/exec", "exec"),
        "^sandboxes/[A-Za-z0-9_-]+/ports/[0-9]+(/.*)?$": (
            f"/sandboxes/{sandbox_id}/ports/8000/",
            "ports",
        ),
    }
    routes = {}
    for pattern in websocket_urlpatterns:
        route = str(pattern.pattern)
        assert route in known, f"new WebSocket route {route}: add it to this test"
        path, scope = known[route]
        routes[path] = scope
    return routes


def test_every_websocket_route_refuses_other_sandboxes_and_missing_scopes(
    api_a, sandbox_a, sandbox_b
):  # type: ignore[no-untyped-def]
    everything = _mint(api_a, sandbox_a["id"], list(TOKEN_SCOPES))
    for path in _ws_routes(sandbox_b["id"]):
        assert _ws_close(f"{path}?token={everything}") == (True, 4404), path
    for path, scope in _ws_routes(sandbox_a["id"]).items():
        if scope is None:
            continue
        lacking = _mint(api_a, sandbox_a["id"], [s for s in TOKEN_SCOPES if s != scope])
        assert _ws_close(f"{path}?token={lacking}") == (True, 4403), path
    preview = f"/sandboxes/{sandbox_b['id']}/ports/8000/?token={everything}"
    assert _preview_status(preview) == 404
    ports_less = _mint(api_a, sandbox_a["id"], ["exec", "files", "terminal"])
    assert _preview_status(f"/sandboxes/{sandbox_a['id']}/ports/8000/?token={ports_less}") == 403


def test_revoking_the_key_ends_its_tokens_on_websockets_and_previews(api_a, sandbox_a, alice):  # type: ignore[no-untyped-def]
    token = _mint(api_a, sandbox_a["id"], list(TOKEN_SCOPES))
    events = f"/ws/sandboxes/{sandbox_a['id']}/events?token={token}"
    preview_ws = f"/sandboxes/{sandbox_a['id']}/ports/8000/?token={token}"
    preview = f"/sandboxes/{sandbox_a['id']}/ports/8000/?token={token}"
    # Accepted before: the events socket stays open, the preview reaches for the port
    # (nothing listens there, so the socket ends 1011 and the page 502, never 4401/401).
    assert _ws_close(events) == (True, None)
    assert _ws_close(preview_ws)[1] != 4401
    assert _preview_status(preview) not in (401, 403, 404)

    owner = Client()
    owner.force_login(alice)
    key = ApiKey.objects.get()
    assert owner.delete(f"/api/v1/api-keys/{key.pk}").status_code == 200
    _poll_until(lambda: _ws_close(events) == (True, 4401), within_s=ENDS_WITHIN_S)
    assert _ws_close(preview_ws) == (True, 4401)
    assert _preview_status(preview) == 401
