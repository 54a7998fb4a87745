"""E2B's sandbox list: every query field the SDK sends is applied (it was read for state and
metadata only, so `template=`, `startedAfter=`, `order=` and `limit=` answered everything),
the v2 list pages on `x-next-token`, and the SDK's own paginator walks those pages."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from e2b import Sandbox as E2BSandbox
from e2b import SandboxQuery
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db(transaction=True)


def e2b_client(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_X_API_KEY=key)
    return client


def _create(client: APIClient, n: int, **body: object) -> list[str]:
    made = []
    for _ in range(n):
        created = client.post("/e2b/v2/sandboxes", {"templateID": "local", **body}, format="json")
        assert created.status_code == 201, created.content
        made.append(created.json()["sandboxID"])
    return made


def _walk(client: APIClient, **query: object) -> list[list[str]]:
    """Every page of the v2 list, following x-next-token."""
    pages, token = [], None
    while True:
        params = {**query, **({"nextToken": token} if token else {})}
        answer = client.get("/e2b/v2/sandboxes", params)
        assert answer.status_code == 200, answer.content
        pages.append([s["sandboxID"] for s in answer.json()])
        token = answer.headers.get("x-next-token")
        if not token:
            return pages


def test_pages_filters_and_order(key_a, key_b, local_sandboxes):  # type: ignore[no-untyped-def]
    client = e2b_client(key_a)
    tagged = _create(client, 3, metadata={"job": "nightly"})
    plain = _create(client, 2)
    _create(e2b_client(key_b), 1)  # another organization's: never listed
    newest_first = [*reversed(tagged + plain)]

    assert _walk(client, limit=2) == [newest_first[:2], newest_first[2:4], newest_first[4:]]
    assert sum(_walk(client, limit=2, order="asc"), []) == tagged + plain
    assert _walk(client) == [newest_first]  # one page of up to 100
    assert _walk(client, metadata="job=nightly", limit=2) == [
        list(reversed(tagged))[:2],
        list(reversed(tagged))[2:],
    ]
    assert _walk(client, template="base") == [newest_first]
    assert _walk(client, template="code-interpreter-v1:latest") == [newest_first]
    assert _walk(client, template="python") == [[]]
    future = (timezone.now() + timedelta(hours=1)).isoformat()
    assert _walk(client, startedAfter=future) == [[]]
    past = (timezone.now() - timedelta(hours=1)).isoformat()
    assert _walk(client, startedAfter=past) == [newest_first]
    assert _walk(client, state="paused") == [[]]
    # The v1 list answers every sandbox at once, as E2B's.
    listed = client.get("/e2b/sandboxes")
    assert [s["sandboxID"] for s in listed.json()] == newest_first
    assert "x-next-token" not in listed.headers

    # A sandbox destroyed between two pages shifts nothing: pages are keyset pages.
    first = client.get("/e2b/v2/sandboxes", {"limit": 2})
    assert client.delete(f"/e2b/sandboxes/{newest_first[1]}").status_code == 204
    second = client.get(
        "/e2b/v2/sandboxes", {"limit": 2, "nextToken": first.headers["x-next-token"]}
    )
    assert [s["sandboxID"] for s in second.json()] == newest_first[2:4]


@pytest.mark.parametrize(
    "query",
    [
        {"limit": 0},
        {"limit": ""},
        {"startedAfter": ""},
        {"order": ""},
        {"limit": 101},
        {"limit": "ten"},
        {"order": "newest"},
        {"startedAfter": "yesterday"},
        {"nextToken": "not-a-token"},
        {"nextToken": "WyIyMDI2Il0"},  # a list of one string
        {"metadata": "no-equals-sign"},
    ],
)
def test_a_list_query_e2b_would_not_take_is_400(key_a, query):  # type: ignore[no-untyped-def]
    answer = e2b_client(key_a).get("/e2b/v2/sandboxes", query)
    assert answer.status_code == 400, answer.content
    assert answer.json()["code"] == 400


def test_the_sdks_paginator_walks_the_pages(e2b_env, key_a):  # type: ignore[no-untyped-def]
    made = [E2BSandbox.create("local", metadata={"run": "pages"}) for _ in range(3)]
    try:
        paginator = E2BSandbox.list(query=SandboxQuery(metadata={"run": "pages"}), limit=2)
        seen = []
        while paginator.has_next:
            seen.append([info.sandbox_id for info in paginator.next_items()])
        assert [len(page) for page in seen] == [2, 1]
        assert sorted(sum(seen, [])) == sorted(s.sandbox_id for s in made)
        assert E2BSandbox.list(query=SandboxQuery(template="python")).next_items() == []
    finally:
        for sandbox in made:
            sandbox.kill()
