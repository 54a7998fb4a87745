"""The E2B layer's OpenAPI document: served to anyone, a valid OpenAPI 3.1 document that
Schemathesis loads, each RPC method it documents routed to its service, and what the
unmodified SDK sends fits it (the document is the server's, the SDK is E2B's: a field the
SDK sends that the document refused would break real clients)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
import schemathesis
from django.test import Client
from e2b.api.client.models.connect_sandbox import ConnectSandbox
from e2b.api.client.models.connect_sandbox_v2 import ConnectSandboxV2
from e2b.api.client.models.new_sandbox import NewSandbox
from e2b.api.client.models.sandbox_timeout_request import SandboxTimeoutRequest
from e2b.envd.process import process_pb as pb

from e2bcompat.schema import e2b_openapi
from tests.e2bcompat.rpc_calls import envelope, envelopes, rpc

pytestmark = pytest.mark.django_db


def _valid(schema_name: str, instance: Any) -> list[str]:
    document = e2b_openapi()
    validator = jsonschema.Draft202012Validator(
        {"$ref": f"#/components/schemas/{schema_name}", "components": document["components"]}
    )
    return [error.message for error in validator.iter_errors(instance)]


def test_the_document_is_public_and_what_the_server_describes():
    served = Client().get("/e2b/openapi.json")
    assert served.status_code == 200
    assert served.json() == e2b_openapi()
    loaded = schemathesis.openapi.from_dict(served.json())
    labels = {result.ok().label for result in loaded.get_all_operations()}
    assert {"POST /sandboxes", "GET /files", "POST /process.Process/Start"} <= labels


def test_every_documented_rpc_is_routed_and_asks_for_credentials():
    """Each documented method reaches its service (which refuses a call without credentials
    UNAUTHENTICATED); a method envd does not have matches no route."""
    document = e2b_openapi()
    methods = {p: item["post"] for p, item in document["paths"].items() if "." in p}
    assert len(methods) == 17
    for path, operation in methods.items():
        if "x-connect-stream" in operation:
            answer = rpc(path, envelope({}), {}, stream=True)
            assert answer.status_code == 200, (path, answer.text)
            flags, end = envelopes(answer.content)[-1]
            assert flags & 0x02 and end["error"]["code"] == "unauthenticated", (path, end)
        else:
            answer = rpc(path, b"{}", {})
            assert answer.status_code == 401, (path, answer.text)
            assert answer.json()["code"] == "unauthenticated"
    assert rpc("/process.Process/Nope", b"{}", {}).status_code == 404


def test_what_the_sdk_sends_fits_the_document():
    create = NewSandbox(
        template_id="base",
        timeout=300,
        auto_pause=False,
        secure=True,
        allow_internet_access=True,
        metadata={"job": "one"},
        env_vars={"A": "1"},
    ).to_dict()
    assert _valid("NewSandbox", create) == []
    assert _valid("Timeout", SandboxTimeoutRequest(timeout=60).to_dict()) == []
    assert _valid("ConnectSandbox", ConnectSandbox(timeout=60).to_dict()) == []
    assert _valid("ConnectSandbox", ConnectSandboxV2(timeout=60, memory=True).to_dict()) == []
    start = pb.StartRequest(
        process=pb.ProcessConfig(cmd="/bin/bash", args=["-l"], envs={"A": "1"}, cwd="/home/user"),
        pty=pb.PTY(size=pb.PTY.Size(cols=80, rows=24)),
        tag="t",
        stdin=True,
    )
    assert _valid("envd.StartRequest", json.loads(start.to_json())) == []
    # And what the document rules out, it rules out.
    assert _valid("NewSandbox", {"templateID": 5}) != []
    assert _valid("Timeout", {}) != []
