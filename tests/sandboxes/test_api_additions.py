"""API details a client SDK needs: an existence check, background commands with their
output, binary-safe output, one meaning of timeout_s, network permission, paths outside
the workspace. Real local provider, real Postgres."""

from __future__ import annotations

import pytest

from tests.conftest import assert_error

pytestmark = pytest.mark.django_db(transaction=True)


def url(sandbox: dict, suffix: str = "") -> str:
    return f"/api/v1/sandboxes/{sandbox['id']}{suffix}"


# --- exists -------------------------------------------------------------------------------


def test_exists_answers_true_and_false_without_an_error(api_a, sandbox_a):
    api_a.put(
        url(sandbox_a, "/files/content?path=here.txt"),
        b"x",
        content_type="application/octet-stream",
    )
    api_a.post(url(sandbox_a, "/commands"), {"command": "ln -s nowhere dangling"}, format="json")
    for path, expected in (("here.txt", True), (".", True), ("dangling", True), ("gone", False)):
        response = api_a.get(url(sandbox_a, "/files/exists"), {"path": path})
        assert response.status_code == 200, response.content
        assert response.json() == {"exists": expected}, path


def test_exists_refuses_paths_leaving_the_sandbox(api_a, sandbox_a):
    assert_error(
        api_a.get(url(sandbox_a, "/files/exists"), {"path": "../../etc/passwd"}),
        400,
        "path_not_allowed",
    )


def test_exists_other_org_and_anonymous(api_b, anon_api, sandbox_a):
    assert_error(api_b.get(url(sandbox_a, "/files/exists"), {"path": "x"}), 404)
    assert_error(anon_api.get(url(sandbox_a, "/files/exists"), {"path": "x"}), 401)
