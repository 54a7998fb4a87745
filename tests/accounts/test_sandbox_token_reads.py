"""A sandbox token's request costs what a known API key's does (accounts/authentication.py):
its organization's row is not read to authenticate it, and one Redis round trip counts it
for the rate limit and reads what its operation needs (the billing period's counters, the
sandbox row's generation), so repeated requests read neither row from PostgreSQL. Every
change is still seen by the next request, a deleted organization's token never gets a 500,
and without Redis a token works as before. The E2B layer's envd requests take the same path
and are counted once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from rest_framework.test import APIClient

from accounts import orgcache
from accounts.authentication import (
    principal_from_sandbox_token,
    request_principal_from_sandbox_token,
)
from accounts.models import ApiKey, Organization
from accounts.services import api_key_revoke
from sandboxes import row_cache
from sandboxes.realtime.auth import RealtimeDenied, realtime_authorize
from tests import organization_writes
from tests.caches import own_cache_prefix, row_reads, until_no_row_is_read
from tests.conftest import assert_error
from tests.e2bcompat.rpc_calls import list_dir
from tests.throttle_clock import limit_per_minute

pytestmark = pytest.mark.django_db

ROWS = ('"sandboxes_sandbox"', '"accounts_organization"')


@pytest.fixture(autouse=True)
def _own_prefix(settings: Any) -> Iterator[None]:
    with own_cache_prefix(settings, "tokens"):
        yield


def _token(api: APIClient, sandbox_id: str, scopes: list[str]) -> str:
    response = api.post(
        f"/api/v1/sandboxes/{sandbox_id}/tokens", {"scopes": scopes, "ttl_s": 600}, format="json"
    )
    assert response.status_code == 201, response.content
    token: str = response.json()["token"]
    return token


def _bearer(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def _row_reads(call: Any, tables: tuple[str, ...] = ROWS) -> tuple[Any, int]:
    return row_reads(call, tables)


def _until_no_row_is_read(call: Any, tables: tuple[str, ...] = ROWS) -> Any:
    return until_no_row_is_read(call, tables)


def test_token_commands_read_no_row_once_cached_and_a_spending_cap_stops_the_next_one(
    api_a: APIClient, sandbox_a: dict[str, Any], org_a: Organization
) -> None:
    sandbox_id = sandbox_a["id"]
    client = _bearer(_token(api_a, sandbox_id, ["exec"]))
    url = f"/api/v1/sandboxes/{sandbox_id}/commands"

    def command() -> Any:
        return client.post(url, {"command": "echo", "args": ["hi"]}, format="json")

    response = _until_no_row_is_read(command)
    assert response.json()["stdout"] == "hi\n"
    organization_writes.cap_set(Organization.objects.get(pk=org_a.pk))
    response, reads = _row_reads(command)
    assert_error(response, 402, "spending_cap_reached")
    assert reads >= 1


def test_token_reads_see_a_change_to_the_sandbox_at_once(
    api_a: APIClient, sandbox_a: dict[str, Any]
) -> None:
    sandbox_id = sandbox_a["id"]
    client = _bearer(_token(api_a, sandbox_id, ["exec"]))

    def get() -> Any:
        return client.get(f"/api/v1/sandboxes/{sandbox_id}")

    _until_no_row_is_read(get)
    assert api_a.delete(f"/api/v1/sandboxes/{sandbox_id}").status_code in (200, 202, 204)
    response, reads = _row_reads(get)
    assert reads >= 1
    assert response.status_code == 200 and response.json()["state"] != "running"


def test_a_token_request_is_counted_once_in_the_tokens_own_bucket(
    api_a: APIClient, sandbox_a: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    limit_per_minute(monkeypatch, 3)
    sandbox_id = sandbox_a["id"]
    token = _token(api_a, sandbox_id, ["exec"])  # the key's bucket, before the low rate
    client = _bearer(token)
    for _ in range(3):
        assert client.get(f"/api/v1/sandboxes/{sandbox_id}").status_code == 200
    assert_error(client.get(f"/api/v1/sandboxes/{sandbox_id}"), 429, "rate_limited")
    # Another token of the same sandbox has a bucket of its own.
    other = _bearer(_token(api_a, sandbox_id, ["exec"]))
    assert other.get(f"/api/v1/sandboxes/{sandbox_id}").status_code == 200


def test_a_deleted_organizations_token_is_refused_without_an_error(
    api_a: APIClient, sandbox_a: dict[str, Any], org_a: Organization
) -> None:
    """Within the moments the minter's check is believed (MINTER_RECHECK_S) the token is
    still decoded as valid: what it names is gone, so a 401 or 404, never a 500."""
    sandbox_id = sandbox_a["id"]
    client = _bearer(_token(api_a, sandbox_id, ["exec"]))
    assert client.get(f"/api/v1/sandboxes/{sandbox_id}").status_code == 200
    Organization.objects.filter(pk=org_a.pk).delete()
    for response in (
        client.get(f"/api/v1/sandboxes/{sandbox_id}"),
        client.post(f"/api/v1/sandboxes/{sandbox_id}/commands", {"command": "true"}, format="json"),
    ):
        assert response.status_code in (401, 404), response.content
        assert response.json()["error"]["code"] in ("authentication_failed", "sandbox_not_found")


def test_without_redis_a_token_reads_its_organization_as_before(
    api_a: APIClient, sandbox_a: dict[str, Any], settings: Any
) -> None:
    sandbox_id = sandbox_a["id"]
    token = _token(api_a, sandbox_id, ["exec"])
    settings.REDIS_URL = ""
    principal = request_principal_from_sandbox_token(token, method="GET")
    assert principal is not None and principal._organization is not None
    response = _bearer(token).get(f"/api/v1/sandboxes/{sandbox_id}")
    assert response.status_code == 200, response.content


def test_a_kept_principal_reads_nothing_ahead(api_a: APIClient, sandbox_a: dict[str, Any]) -> None:
    """A WebSocket keeps its principal for its whole life: values read when it connected
    would be stale by its later operations, so that kind reads none ahead."""
    token = _token(api_a, sandbox_a["id"], ["exec"])
    kept = principal_from_sandbox_token(token)
    assert kept is not None and kept._read == {} and kept._organization is not None
    one_request = request_principal_from_sandbox_token(token, method="GET")
    assert one_request is not None and one_request._organization is None
    assert orgcache.epoch_key() in one_request._read
    assert row_cache.generation_keys(sandbox_a["id"])[0] in one_request._read


@pytest.mark.django_db(transaction=True)
def test_an_envd_request_with_the_access_token_is_counted_once(
    api_a: APIClient, sandbox_a: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    limit_per_minute(monkeypatch, 3)
    sandbox_id = sandbox_a["id"]
    headers = {
        "X-Access-Token": _token(api_a, sandbox_id, ["exec", "files"]),
        "E2b-Sandbox-Id": sandbox_id,
    }
    for _ in range(3):
        response = list_dir(headers)
        assert response.status_code == 200, response.text
    refused = list_dir(headers)
    assert refused.status_code == 429, refused.text
    assert refused.json()["code"] == "resource_exhausted"


def test_the_e2b_control_plane_confirms_a_known_key_without_the_database(
    key_a: str, org_a: Organization
) -> None:
    """E2B's `X-API-Key` goes the way of Sandpit's own bearer key: read once, then confirmed
    in Redis, and a revocation is refused on the very next request."""
    client = APIClient()
    client.credentials(HTTP_X_API_KEY=key_a)

    def listing() -> Any:
        return client.get("/e2b/v2/sandboxes")

    _until_no_row_is_read(listing, ('"accounts_apikey"',))
    api_key_revoke(api_key=ApiKey.objects.get(organization=org_a))
    response = listing()
    assert response.status_code == 401, response.content


@pytest.mark.parametrize("kind", ["http", "websocket"])
def test_a_preview_request_reads_no_organization_row_and_a_socket_reads_it_at_connect(
    api_a: APIClient, sandbox_a: dict[str, Any], kind: str
) -> None:
    """The preview proxy authorizes each request as the REST API does; a WebSocket, which
    keeps its principal, reads its organization as it connects."""
    sandbox_id = sandbox_a["id"]
    token = _token(api_a, sandbox_id, ["ports"])
    scope = {
        "type": kind,
        "method": "GET",
        "query_string": f"token={token}".encode(),
        "headers": [],
    }

    def authorize() -> tuple[Any, Any]:
        return realtime_authorize(
            scope, sandbox_id=sandbox_id, required_scope="ports", feature="ports"
        )

    reads = -1
    for _ in range(4):
        (caller, sandbox), reads = _row_reads(authorize)
        assert sandbox.id == sandbox_id and caller.principal.token is not None
        if reads == 0:
            break
    assert (reads == 0) == (kind == "http"), reads


def _session(user: Any) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def test_a_sessions_commands_read_no_sandbox_row_once_cached(
    alice: Any, org_a: Organization, api_a: APIClient, sandbox_a: dict[str, Any]
) -> None:
    """A browser session's request reads ahead in its rate limit's round trip as a key's
    does: its commands then read no sandbox row, and a spending cap set meanwhile still
    refuses the very next one."""
    client = _session(alice)
    url = f"/api/v1/sandboxes/{sandbox_a['id']}/commands"

    def command() -> Any:
        return client.post(url, {"command": "true"}, format="json")

    # A session's own organization is read with its membership on every request.
    _until_no_row_is_read(command, tables=('"sandboxes_sandbox"',))
    organization_writes.cap_set(Organization.objects.get(pk=org_a.pk))
    assert_error(command(), 402, "spending_cap_reached")


def test_a_sessions_request_is_counted_once_in_the_users_bucket(
    alice: Any, bob: Any, org_a: Organization, monkeypatch: pytest.MonkeyPatch
) -> None:
    limit_per_minute(monkeypatch, 3)
    client = _session(alice)
    for _ in range(3):
        assert client.get("/api/v1/sandboxes").status_code == 200
    assert_error(client.get("/api/v1/sandboxes"), 429, "rate_limited")
    assert _session(bob).get("/api/v1/sandboxes").status_code == 200  # a bucket of his own


@pytest.mark.parametrize("kind", ["http", "websocket"])
def test_a_sockets_or_previews_api_key_is_confirmed_without_the_database(
    key_a: str, org_a: Organization, sandbox_a: dict[str, Any], kind: str
) -> None:
    """An API key on a socket or a preview request goes the way of the REST API's: read
    once, then confirmed in Redis (nothing read ahead: a socket keeps its principal), and
    refused as soon as it is revoked."""
    scope = {
        "type": kind,
        "method": "GET",
        "query_string": b"",
        "headers": [(b"authorization", f"Bearer {key_a}".encode())],
    }

    def authorize() -> tuple[Any, Any]:
        return realtime_authorize(
            scope, sandbox_id=sandbox_a["id"], required_scope="ports", feature="ports"
        )

    reads = -1
    for _ in range(4):
        (caller, _sandbox), reads = _row_reads(authorize, tables=('"accounts_apikey"',))
        assert caller.principal.api_key is not None and caller.principal._read == {}
        if reads == 0:
            break
    assert reads == 0
    api_key_revoke(api_key=ApiKey.objects.get(organization=org_a))
    with pytest.raises(RealtimeDenied) as refused:
        authorize()
    assert refused.value.http_status == 401
