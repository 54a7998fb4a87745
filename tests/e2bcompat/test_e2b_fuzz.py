"""Fuzz the E2B-compatible API from its own OpenAPI document (Schemathesis), against the
product's web server on this test's PostgreSQL and Redis, creating real local sandboxes.

Every operation of `/e2b/openapi.json` (the control plane, envd's /files and /health, and
every Connect RPC method) is called with Hypothesis-generated paths, queries, headers and
bodies, valid and invalid alike, with an API key (`X-API-Key`) and with the envd access token
of the live sandbox (`X-Access-Token`). Half the cases aim at that sandbox (its id in the
path or `E2b-Sandbox-Id`), so the generated input reaches the providers.

The HTTP endpoints get Schemathesis' checks: no server error, a documented status and
body (errors in E2B's shape), refusal of what the schema rules out and of a request without
credentials; unary RPCs the same but refusal of what the schema rules out (see
RPC_EXCLUDED). Streaming RPCs take and answer Connect envelopes,
which Schemathesis does not frame: the test generates their message from the document's
`x-connect-stream` schema, frames it, and checks the answer itself: envelopes that parse,
messages of the documented schema, an end of stream whose error (if any) is a Connect code
other than internal or unknown, and an error for a message that is not a JSON object.

Examples per operation and principal: SANDPIT_FUZZ_EXAMPLES (default 12), derandomized.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest
import schemathesis
from schemathesis import checks
from schemathesis.core import NOT_SET

from tests.e2bcompat.rpc_calls import envelope, envelopes
from tests.fuzzing import (
    FuzzedOrganization,
    described,
    each_generated_case,
    fuzzed_server,
    successes_by_principal,
)

pytestmark = pytest.mark.django_db(transaction=True)
# Requests valid by the schema that the server refuses for rules the schema cannot state (a
# template that exists, a path inside the sandbox, a process that runs): 4xx in the error
# shape, which the other checks hold.
EXCLUDED = [checks.positive_data_acceptance]
# The document gives each RPC message's canonical ProtoJSON, which is what the server
# writes; a ProtoJSON reader also takes null for any field, numbers as strings, enums by
# number and fields by their proto names, so a message "invalid" by the document may be one
# envd takes. For RPCs the checks are no server fault and a documented answer.
RPC_EXCLUDED = [*EXCLUDED, checks.negative_data_rejection]
CONNECT_HEADERS = {"Connect-Protocol-Version": "1"}
STREAM_DEADLINE_MS = 2000
SERVER_FAULTS = {"internal", "unknown", "data_loss"}
END_OF_STREAM = 0x02
OUTCOMES = {"not_found": 404, "unauthenticated": 401, "permission_denied": 403}


@pytest.fixture
def served(transactional_db, settings, tmp_path) -> Iterator[str]:  # type: ignore[no-untyped-def]
    with fuzzed_server(settings, tmp_path) as base:
        yield base


def _streams_as_json(document: dict[str, Any]) -> dict[str, Any]:
    """The document with each streaming RPC's request body as its message's JSON, so that
    Schemathesis generates the message the test then frames."""
    generating = copy.deepcopy(document)
    for item in generating["paths"].values():
        for operation in item.values():
            stream = operation.get("x-connect-stream")
            if stream:
                operation["requestBody"]["content"] = {
                    "application/json": {"schema": stream["request"]}
                }
    return generating


class Streams:
    """Calls a streaming RPC with a generated message and checks the enveloped answer."""

    def __init__(self, base: str, document: dict[str, Any]) -> None:
        self.base = base
        self.document = document

    def _validator(self, schema: dict[str, Any]) -> jsonschema.Draft202012Validator:
        return jsonschema.Draft202012Validator(
            {**schema, "components": self.document["components"]}
        )

    def call(self, case: Any, headers: dict[str, str]) -> tuple[int, list[str]]:
        """The outcome and what is wrong with the answer. The outcome is the HTTP status, but
        for a stream that ended with an error (HTTP 200) the status the error's code stands
        for (OUTCOMES; other refusals 400)."""
        stream = case.operation.definition.raw["x-connect-stream"]
        request_headers = {
            **{k: str(v) for k, v in (case.headers or {}).items()},
            **headers,
            **CONNECT_HEADERS,
            "Content-Type": "application/connect+json",
            "Connect-Timeout-Ms": str(STREAM_DEADLINE_MS),
        }
        body = case.body if case.body is not NOT_SET else {}
        chunks, started = [], time.monotonic()
        try:
            with httpx.stream(
                "POST",
                f"{self.base}/e2b{case.formatted_path}",
                content=envelope(body),
                headers=request_headers,
                timeout=15,
            ) as response:
                for chunk in response.iter_bytes():
                    chunks.append(chunk)
                    # A PTY's stream lasts while the shell does: hang up, as the SDK may.
                    if time.monotonic() - started > STREAM_DEADLINE_MS / 1000 + 3:
                        break
        except httpx.TimeoutException:
            silent = (
                f"nothing for 15 s (deadline {STREAM_DEADLINE_MS} ms) after {b''.join(chunks)!r}"
            )
            return 599, [f"{silent}; sent {body!r} with {request_headers}"]
        problems: list[str] = []
        if response.status_code != 200:
            if response.status_code >= 500:
                problems.append(f"HTTP {response.status_code}: {b''.join(chunks)[:500]!r}")
            return response.status_code, problems
        try:
            answered = envelopes(b"".join(chunks))
        except (AssertionError, ValueError) as broken:
            if len(b"".join(chunks)) and time.monotonic() - started < STREAM_DEADLINE_MS / 1000 + 3:
                problems.append(f"broken framing: {broken}")
            return 200, problems
        answer = self._validator(stream["response"])
        end = None
        for flags, message in answered:
            if flags & END_OF_STREAM:
                end = message
            else:
                problems += [f"message {message}: {e.message}" for e in answer.iter_errors(message)]
        if end is None:
            return 200, problems  # hung up on a live stream
        error = end.get("error")
        if error is not None:
            code = error.get("code")
            if code in SERVER_FAULTS or not isinstance(code, str):
                problems.append(f"server fault at end of stream: {error}")
            return OUTCOMES.get(code, 400), problems
        if isinstance(body, bytes) or not isinstance(body, dict):
            problems.append(f"accepted a message that is not a JSON object: {body!r}")
        return 200, problems


def _fuzz(
    operation: Any,
    base: str,
    headers: dict[str, str],
    sandbox_id: str,
    streams: Streams,
    *,
    always_aim: bool = False,
) -> tuple[list[int], list[BaseException]]:
    """The operation's outcomes and failures; `always_aim`: every case at `sandbox_id`."""
    statuses: list[int] = []
    found: list[BaseException] = []
    streaming = "x-connect-stream" in operation.definition.raw
    rpc = operation.path.startswith(("/process.", "/filesystem."))
    envd = any(
        p.get("name") == "E2b-Sandbox-Id" for p in operation.definition.raw.get("parameters", [])
    )

    def run(case: Any, aim_at_live: bool) -> None:
        if aim_at_live or always_aim:
            if "sandboxID" in (case.path_parameters or {}):
                case.path_parameters["sandboxID"] = sandbox_id
            if (always_aim and envd) or "E2b-Sandbox-Id" in (case.headers or {}):
                case.headers = {**(case.headers or {}), "E2b-Sandbox-Id": sandbox_id}
        if streaming:
            outcome, problems = streams.call(case, headers)
            statuses.append(outcome)
            if problems:
                found.append(AssertionError(f"{case.formatted_path}: " + "; ".join(problems)))
            return
        sent = {**headers, **(CONNECT_HEADERS if rpc else {})}
        answer = case.call(base_url=f"{base}/e2b", headers=sent, timeout=60)
        statuses.append(answer.status_code)
        try:
            case.validate_response(answer, excluded_checks=RPC_EXCLUDED if rpc else EXCLUDED)
        except (AssertionError, BaseExceptionGroup) as failure:
            found.append(failure)

    each_generated_case(operation, run)
    return statuses, found


def _access_token(base: str, key: str, sandbox_id: str) -> str:
    connected = httpx.post(
        f"{base}/e2b/sandboxes/{sandbox_id}/connect",
        json={},
        headers={"X-API-Key": key},
        timeout=30,
    )
    assert connected.status_code == 200, connected.text
    return str(connected.json()["envdAccessToken"])


def test_every_e2b_operation_holds_up_to_generated_input(served, org_a, alice):  # type: ignore[no-untyped-def]
    document = httpx.get(f"{served}/e2b/openapi.json", timeout=30).json()
    generating = _streams_as_json(document)
    operations = [
        result.ok() for result in schemathesis.openapi.from_dict(generating).get_all_operations()
    ]
    # Destroying and pausing last: the others' cases run on a live sandbox.
    operations.sort(key=lambda op: op.method.upper() == "DELETE" or op.path.endswith("/pause"))
    assert len(operations) >= 30
    fuzzed = FuzzedOrganization(served, org_a, alice)
    streams = Streams(served, document)
    failures: dict[str, str] = {}
    statuses: dict[tuple[str, str], list[int]] = {}
    try:
        for operation in operations:
            for who in ("key", "token"):
                fuzzed.restore()
                key = fuzzed.key_secret()
                sandbox_id = fuzzed.running_sandbox({"Authorization": f"Bearer {key}"})
                headers = (
                    {"X-API-Key": key}
                    if who == "key"
                    else {"X-Access-Token": _access_token(served, key, sandbox_id)}
                )
                answered, found = _fuzz(operation, served, headers, sandbox_id, streams)
                statuses[(who, operation.label)] = answered
                failures.update(described(f"{who} {operation.label}", found))
    finally:
        fuzzed.destroy_all(fuzzed.key_headers())

    assert not failures, "\n\n".join(failures.values())
    succeeded = successes_by_principal(statuses)
    assert succeeded["key"] >= 40 and succeeded["token"] >= 15, (succeeded, statuses)
    # The generated messages reached the services on the live sandbox, not only the codec.
    unary = {
        f"POST {path}"
        for path, item in document["paths"].items()
        if "." in path and "x-connect-stream" not in item["post"]
    }
    rpc_done = {
        label for (_who, label), codes in statuses.items() if label in unary and 200 in codes
    }
    assert len(rpc_done) >= 4, (rpc_done, statuses)
    for label in (
        "POST /sandboxes",
        "POST /files",
        "POST /process.Process/List",
    ):
        assert any(code < 300 for code in statuses[("key", label)]), (
            label,
            statuses[("key", label)],
        )


def test_another_organizations_key_reaches_none_of_its_sandboxes(
    served, org_a, alice, org_b, charlie
):  # type: ignore[no-untyped-def]
    """Every operation on a sandbox (its id in the path or E2b-Sandbox-Id), with generated
    input, aimed at organization A's running sandbox with organization B's key: never a
    success (a stream's end carries its error), and A's sandbox untouched."""
    document = httpx.get(f"{served}/e2b/openapi.json", timeout=30).json()
    operations = [
        op
        for op in (
            r.ok()
            for r in schemathesis.openapi.from_dict(_streams_as_json(document)).get_all_operations()
        )
        if "{sandboxID}" in op.path
        or any(p.get("name") == "E2b-Sandbox-Id" for p in op.definition.raw.get("parameters", []))
    ]
    assert len(operations) >= 24
    owner = FuzzedOrganization(served, org_a, alice)
    stranger = {"X-API-Key": FuzzedOrganization(served, org_b, charlie).key_secret()}
    sandbox_id = owner.running_sandbox(owner.key_headers())
    streams = Streams(served, document)
    failures: dict[str, str] = {}
    statuses: dict[str, list[int]] = {}
    try:
        for operation in operations:
            answered, found = _fuzz(
                operation, served, stranger, sandbox_id, streams, always_aim=True
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
    assert sum(codes.count(404) for codes in statuses.values()) >= 3 * len(operations)
