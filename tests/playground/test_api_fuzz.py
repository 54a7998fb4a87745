"""Fuzz the REST API from its own OpenAPI schema (Schemathesis), against the product's web
server on this test's PostgreSQL and Redis, creating real local sandboxes.

Every operation of `/api/schema/` is called with Hypothesis-generated paths, queries, headers
and bodies (valid ones, and with the negative data Schemathesis derives from the schema), with
an API key, as a signed-in owner's browser session, and with a sandbox token of the live
sandbox (every scope); a credential the schema does not list for an operation must be refused. Each answer must be no
server error, of a documented status (errors: the `default` response, the one error shape),
match its documented schema, content type and headers, refuse what the schema rules out, and
(for the key) refuse a request without credentials. Half the cases aim at a live sandbox of
the organization rather than a made-up id, so the generated input reaches the providers.

Not checked: that every request valid by the schema succeeds (Schemathesis' positive data
acceptance). Some rules are not the schema's to state: a Dockerfile's syntax, a provider
being enabled on this installation, exactly one of `code` and `command`; such requests are
refused 400 in the error shape, which the other checks hold.

Examples per operation and principal: SANDPIT_FUZZ_EXAMPLES (default 12), derandomized, so CI
runs the same cases each time; raise it by hand for a longer hunt.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from django.test import Client
from schemathesis import checks

from accounts.models import User
from tests.fuzzing import (
    FuzzedOrganization,
    described,
    each_generated_case,
    fuzzed_server,
    successes_by_principal,
)

pytestmark = pytest.mark.django_db(transaction=True)
SEMANTIC = [checks.positive_data_acceptance]
# A session's cookie is sent as a header the schema's generator does not know of: it cannot
# leave it out for its "without credentials" cases (the key and the token cover those).
EXCLUDED = {
    "key": SEMANTIC,
    "token": SEMANTIC,
    "session": [*SEMANTIC, checks.ignored_auth, checks.negative_data_rejection],
}
# Last: operations that change what the others run under (the plan, the spending cap,
# members, keys, the organization's settings).
ORGANIZATION_WIDE = (
    "/api/v1/billing",
    "/api/v1/organization",
    "/api/v1/members",
    "/api/v1/api-keys",
)


@pytest.fixture
def served(transactional_db, settings, tmp_path) -> Iterator[str]:  # type: ignore[no-untyped-def]
    with fuzzed_server(settings, tmp_path) as base:
        yield base


def _session_headers(user: User) -> dict[str, str]:
    """A signed-in browser's credentials: its session cookie, and a CSRF secret of its own
    choosing sent as both the cookie and the header (Django's double submit)."""
    client = Client()
    client.force_login(user)
    csrf = "f" * 32
    return {
        "Cookie": f"sessionid={client.cookies['sessionid'].value}; csrftoken={csrf}",
        "X-CSRFToken": csrf,
    }


def _fuzz(
    operation: Any,
    base: str,
    headers: dict[str, str],
    sandbox_id: str,
    excluded: list[Any],
    *,
    always_aim: bool = False,
) -> tuple[list[int], list[BaseException]]:
    """Run the operation's generated cases; the statuses answered and the failures found.
    `always_aim`: every case at `sandbox_id` (else half of them)."""
    statuses: list[int] = []
    found: list[BaseException] = []

    def run(case: Any, aim_at_live: bool) -> None:
        if (aim_at_live or always_aim) and "sandbox_id" in (case.path_parameters or {}):
            case.path_parameters["sandbox_id"] = sandbox_id
        response = case.call(base_url=base, headers=headers, timeout=60)
        statuses.append(response.status_code)
        try:
            case.validate_response(response, excluded_checks=excluded)
        except (AssertionError, BaseExceptionGroup) as failure:
            found.append(failure)

    each_generated_case(operation, run)
    return statuses, found


def test_every_operation_of_the_schema_holds_up_to_generated_input(served, org_a, alice):  # type: ignore[no-untyped-def]
    raw = httpx.get(f"{served}/api/schema/?format=json", timeout=30).json()
    operations = [
        result.ok() for result in schemathesis.openapi.from_dict(raw).get_all_operations()
    ]
    operations.sort(key=lambda op: op.path.startswith(ORGANIZATION_WIDE))
    assert len(operations) >= 60
    fuzzed = FuzzedOrganization(served, org_a, alice)
    principals: dict[str, Callable[[str], dict[str, str]]] = {
        "key": lambda _sandbox: fuzzed.key_headers(),
        "session": lambda _sandbox: _session_headers(alice),
        "token": fuzzed.token_headers,
    }
    failures: dict[str, str] = {}
    statuses: dict[tuple[str, str], list[int]] = {}
    try:
        for operation in operations:
            for who, credentials in principals.items():
                # What the previous cases may have undone: the organization's settings, the
                # live sandbox (destroyed, paused), the key (revoked).
                fuzzed.restore()
                sandbox_id = fuzzed.running_sandbox(fuzzed.key_headers())
                headers = credentials(sandbox_id)
                answered, found = _fuzz(operation, served, headers, sandbox_id, EXCLUDED[who])
                statuses[(who, operation.label)] = answered
                failures.update(described(f"{who} {operation.label}", found))
    finally:
        fuzzed.destroy_all(fuzzed.key_headers())

    assert not failures, "\n\n".join(failures.values())
    # The cases reached past authentication and validation: every principal had operations
    # answered 2xx, and sandbox operations aimed at the live sandbox did work there.
    succeeded = successes_by_principal(statuses)
    assert succeeded["key"] >= 100 and succeeded["session"] >= 100, (succeeded, statuses)
    assert succeeded["token"] >= 30, (succeeded, statuses)
    # Each operation's documented credentials are the ones it takes: a credential the schema
    # does not list for it is refused, whatever the generated input (404: a generated path
    # that matches no route, before any view; 400: a malformed ?format=, refused in content
    # negotiation, which DRF runs before authentication).
    scheme = {"key": "ApiKey", "session": "Session", "token": "SandboxToken"}
    for (who, label), codes in statuses.items():
        method, path = label.split(" ", 1)
        security = raw["paths"][path][method.lower()].get("security", [])
        if not any(scheme[who] in requirement for requirement in security):
            assert 403 in codes and set(codes) <= {400, 403, 404}, (who, label, codes)
    for label in (
        "POST /api/v1/sandboxes",
        "POST /api/v1/sandboxes/{sandbox_id}/commands",
        "GET /api/v1/sandboxes/{sandbox_id}/files",
        "PUT /api/v1/sandboxes/{sandbox_id}/files/content",
    ):
        assert any(code < 300 for code in statuses[("key", label)]), (
            label,
            statuses[("key", label)],
        )


def test_every_operation_documents_its_answer_and_errors():
    """What a client generated from the schema needs: the body of each success (204s have
    none) and the error shape as every operation's other answers."""
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    undocumented = []
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            responses = operation["responses"]
            assert responses["default"]["content"]["application/json"]["schema"] == {
                "$ref": "#/components/schemas/Error"
            }, (method, path)
            for status, response in responses.items():
                if status.startswith("2") and status != "204" and "content" not in response:
                    undocumented.append(f"{method.upper()} {path} {status}")
    assert undocumented == []
    error = schema["components"]["schemas"]["Error"]
    assert error["properties"]["error"]["required"] == ["code", "message"]


def test_another_organizations_key_reaches_none_of_its_sandboxes(
    served, org_a, alice, org_b, charlie
):  # type: ignore[no-untyped-def]
    """Every operation on a sandbox, with generated input, aimed at organization A's running
    sandbox with organization B's key: never a success, always the error shape, and A's
    sandbox untouched (a tenant's id is a 404 everywhere, whatever else the request holds)."""
    raw = httpx.get(f"{served}/api/schema/?format=json", timeout=30).json()
    operations = [
        op
        for op in (r.ok() for r in schemathesis.openapi.from_dict(raw).get_all_operations())
        if "{sandbox_id}" in op.path
    ]
    assert len(operations) >= 30
    owner = FuzzedOrganization(served, org_a, alice)
    stranger = FuzzedOrganization(served, org_b, charlie).key_headers()
    sandbox_id = owner.running_sandbox(owner.key_headers())
    failures: dict[str, str] = {}
    statuses: dict[str, list[int]] = {}
    try:
        for operation in operations:
            answered, found = _fuzz(
                operation, served, stranger, sandbox_id, EXCLUDED["key"], always_aim=True
            )
            statuses[operation.label] = answered
            failures.update(described(f"stranger {operation.label}", found))
        still = httpx.get(
            f"{served}/api/v1/sandboxes/{sandbox_id}", headers=owner.key_headers(), timeout=30
        )
        assert still.status_code == 200 and still.json()["state"] == "running", still.text
    finally:
        owner.destroy_all(owner.key_headers())
    assert not failures, "\n\n".join(failures.values())
    succeeded = {label: codes for label, codes in statuses.items() if any(c < 300 for c in codes)}
    assert succeeded == {}
    # Most cases got past validation to the tenancy check: the stranger saw 404s.
    assert sum(codes.count(404) for codes in statuses.values()) >= 5 * len(operations)
