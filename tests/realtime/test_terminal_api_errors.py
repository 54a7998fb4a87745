"""Bad input to the terminal REST endpoints: the one error shape, nothing created, nothing counted."""

from __future__ import annotations

import pytest

from sandboxes.terminals import terminal_manager
from tests.conftest import assert_error

pytestmark = pytest.mark.django_db(transaction=True)


def test_terminal_validation_and_tenancy_errors(api_a, api_b, sandbox_a):
    base = f"/api/v1/sandboxes/{sandbox_a['id']}/terminals"
    before = api_a.get("/api/v1/usage").json()["executions"]
    assert_error(api_a.post(base, {"cols": 0}, format="json"), 400, "validation_error")
    assert_error(api_a.post(base, {"rows": "tall"}, format="json"), 400, "validation_error")
    assert_error(api_a.post(base, {"shell": "bash -c id"}, format="json"), 400, "validation_error")
    assert_error(api_a.post(base, {"cwd": "a\x00b"}, format="json"), 400, "validation_error")
    assert_error(api_a.post(base, data="{oops", content_type="application/json"), 400)
    assert_error(api_a.delete(f"{base}/term_nope"), 404)
    assert_error(
        api_a.post(f"{base}/term_nope/resize", {"cols": 80, "rows": 24}, format="json"), 404
    )
    assert_error(api_b.post(base, {}, format="json"), 404, "sandbox_not_found")
    assert_error(api_b.get(base), 404, "sandbox_not_found")
    assert terminal_manager.for_sandbox(sandbox_a["id"]) == []
    assert api_a.get("/api/v1/usage").json()["executions"] == before  # refused: not counted
