"""The E2B layer's edges, in process: the per-key rate limit on its Connect RPC services
(the same buckets as Sandpit's REST API and E2B's control plane), and Idempotency-Key on
its create."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from rest_framework.test import APIClient

from accounts.throttling import PerKeyRateThrottle
from billing.models import UsageEvent
from billing.services import usage_flush
from sandboxes.models import Sandbox
from tests.e2bcompat.rpc_calls import list_dir
from tests.throttle_clock import limit_per_minute

pytestmark = pytest.mark.django_db(transaction=True)


def e2b_client(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_X_API_KEY=key)
    return client


@pytest.fixture
def three_a_minute(monkeypatch):  # type: ignore[no-untyped-def]
    limit_per_minute(monkeypatch, 3)
    # Fresh buckets: key ids repeat across test databases, Redis outlives them.
    monkeypatch.setattr(
        PerKeyRateThrottle, "cache_format", f"throttle_{uuid.uuid4().hex}_%(scope)s_%(ident)s"
    )


def rpc_list_dir(key: str, sandbox_id: str) -> httpx.Response:
    """One Connect RPC (JSON) call, filesystem.Filesystem/ListDir, through the E2B router."""
    return list_dir({"X-API-Key": key, "E2b-Sandbox-Id": sandbox_id})


def test_rpc_calls_share_the_keys_rate_limit(three_a_minute, key_a, key_b, local_sandboxes):  # type: ignore[no-untyped-def]
    created = e2b_client(key_a).post("/e2b/v2/sandboxes", {"templateID": "local"}, format="json")
    assert created.status_code == 201, created.content  # the first request in the bucket
    sandbox_id = created.json()["sandboxID"]
    for _ in range(2):
        assert rpc_list_dir(key_a, sandbox_id).status_code == 200
    refused = rpc_list_dir(key_a, sandbox_id)
    assert refused.status_code == 429, refused.text
    assert refused.json()["code"] == "resource_exhausted"
    assert "throttled" in refused.json()["message"]
    # The control plane counts in the same bucket; another key has its own.
    assert e2b_client(key_a).get("/e2b/v2/sandboxes").status_code == 429
    other = rpc_list_dir(key_b, sandbox_id)
    assert other.status_code == 404 and other.json()["code"] == "not_found"


def _creates(organization: Any) -> int:
    """Creates counted for the organization so far (pending events flushed first)."""
    usage_flush()
    return UsageEvent.objects.filter(organization=organization, operation="sandbox.create").count()


def test_create_runs_once_per_idempotency_key(key_a, org_a, local_sandboxes, settings):  # type: ignore[no-untyped-def]
    # Usage of this test alone: other test runs on this Redis with the same organization
    # ids would flush (or have remembered) events under the shared installation name.
    settings.SANDPIT_INSTALLATION = f"e2b-edges-{uuid.uuid4().hex}"
    client = e2b_client(key_a)
    body = {"templateID": "local", "metadata": {"job": "one"}}
    before = _creates(org_a)
    key = "job-1"
    first = client.post("/e2b/v2/sandboxes", body, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert first.status_code == 201, first.content
    again = client.post("/e2b/v2/sandboxes", body, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert again.status_code == 201
    assert again["Idempotent-Replayed"] == "true"
    assert again.json()["sandboxID"] == first.json()["sandboxID"]
    assert Sandbox.objects.filter(organization=org_a).count() == 1
    assert _creates(org_a) == before + 1
    other_body = client.post(
        "/e2b/v2/sandboxes", {"templateID": "local"}, format="json", HTTP_IDEMPOTENCY_KEY=key
    )
    assert other_body.status_code == 422, other_body.content
    assert other_body.json()["code"] == 422
    unkeyed = [client.post("/e2b/v2/sandboxes", body, format="json") for _ in range(2)]
    assert [r.status_code for r in unkeyed] == [201, 201]
    assert Sandbox.objects.filter(organization=org_a).count() == 3
    assert _creates(org_a) == before + 3


def test_a_failed_create_frees_its_key(key_a, org_a, local_sandboxes):  # type: ignore[no-untyped-def]
    client = e2b_client(key_a)
    refused = client.post(
        "/e2b/v2/sandboxes", {"templateID": "nope"}, format="json", HTTP_IDEMPOTENCY_KEY="k"
    )
    assert refused.status_code == 404
    body = {"templateID": "local", "timeout": -1}
    invalid = client.post("/e2b/v2/sandboxes", body, format="json", HTTP_IDEMPOTENCY_KEY="k2")
    assert invalid.status_code == 400
    body["timeout"] = 60
    retried = client.post("/e2b/v2/sandboxes", body, format="json", HTTP_IDEMPOTENCY_KEY="k2")
    assert retried.status_code == 201, retried.content
    assert "Idempotent-Replayed" not in retried
