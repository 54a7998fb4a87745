"""The E2B-compatible API's own OpenAPI document (GET /e2b/openapi.json).

What Sandpit serves of E2B's API, as it serves it: the control plane and envd's plain HTTP
endpoints described here, and envd's Connect RPC methods derived from the protobuf
descriptors of the installed `e2b` package (the same tables e2bcompat/asgi.py serves), each
message's JSON form as protobuf-py gives it to pydantic. Unary methods take and answer JSON;
streaming ones take and answer Connect's enveloped `application/connect+json`, documented as
bytes. Errors: the control plane's E2B shape (`code`, `message`, Sandpit's `error` beside
them); RPCs' Connect error (`code` a name such as `not_found`, `message`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

from connectrpc.code import Code
from e2b.envd.filesystem import filesystem_pb
from e2b.envd.filesystem.filesystem_connect import Filesystem
from e2b.envd.process import process_pb
from e2b.envd.process.process_connect import Process
from protobuf import DescMessage
from pydantic import TypeAdapter
from pydantic.json_schema import JsonSchemaMode

from . import translate
from .listing import MAX_PAGE, STATES_PATTERN

Schema = dict[str, Any]
_REF = "#/components/schemas/"
RPC_SERVICES = ((Process, process_pb), (Filesystem, filesystem_pb))
CONNECT_STREAM = "application/connect+json"
CONNECT_CODES = [code.value for code in Code]  # connectrpc's names, as on the wire


def _ref(name: str) -> Schema:
    return {"$ref": _REF + name}


def _strings() -> Schema:
    return {"type": "object", "additionalProperties": {"type": "string"}}


_SANDBOX_FIELDS: Schema = {
    "templateID": {"type": "string"},
    "sandboxID": {"type": "string"},
    "clientID": {"type": "string"},
    "envdVersion": {"type": "string", "const": translate.ENVD_VERSION},
}
_LISTED_FIELDS: Schema = {
    **_SANDBOX_FIELDS,
    "startedAt": {"type": "string", "format": "date-time"},
    "endAt": {"type": "string", "format": "date-time"},
    "cpuCount": {"type": "integer", "minimum": 1},
    "memoryMB": {"type": "integer", "minimum": 0},
    "diskSizeMB": {"type": "integer", "minimum": 0},
    "state": {"type": "string", "enum": ["running", "paused"]},
    "metadata": _strings(),
}
TIMEOUT: Schema = {  # null: the installation's default
    "type": ["integer", "null"],
    "minimum": 0,
    "description": "Seconds; capped at the installation's longest lifetime.",
}

CONTROL_SCHEMAS: dict[str, Schema] = {
    "Error": {
        "type": "object",
        "description": "E2B's error (`code`: the HTTP status), Sandpit's `error` beside it.",
        "required": ["code", "message"],
        "properties": {
            "code": {"type": "integer"},
            "message": {"type": "string"},
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
            },
        },
    },
    "ConnectError": {
        "type": "object",
        "required": ["code"],
        "properties": {
            "code": {"type": "string", "enum": CONNECT_CODES},
            "message": {"type": "string"},
        },
    },
    "NewSandbox": {
        "type": "object",
        "description": "Fields E2B defines and Sandpit does not use (autoPause, secure, "
        "network...) are accepted and ignored.",
        "properties": {
            "templateID": {
                "type": ["string", "null"],
                "description": "E2B's base templates, a provider's name or a Sandpit template.",
            },
            "timeout": TIMEOUT,
            "allow_internet_access": {"type": ["boolean", "null"]},
            "metadata": {**_strings(), "type": ["object", "null"]},
            "envVars": {**_strings(), "type": ["object", "null"]},
        },
    },
    "Sandbox": {
        "type": "object",
        "required": [*_SANDBOX_FIELDS, "envdAccessToken"],
        "properties": {
            **_SANDBOX_FIELDS,
            "envdAccessToken": {"type": "string"},
            "trafficAccessToken": {"type": ["string", "null"]},
            "domain": {"type": ["string", "null"]},
        },
    },
    "ListedSandbox": {
        "type": "object",
        "required": list(_LISTED_FIELDS),
        "properties": _LISTED_FIELDS,
    },
    "SandboxDetail": {
        "type": "object",
        "required": [*_LISTED_FIELDS, "allowInternetAccess"],
        "properties": {
            **_LISTED_FIELDS,
            "domain": {"type": ["string", "null"]},
            "allowInternetAccess": {"type": "boolean"},
        },
    },
    "Timeout": {
        "type": "object",
        "required": ["timeout"],
        "properties": {"timeout": {**TIMEOUT, "type": "integer"}},
    },
    "ConnectSandbox": {"type": "object", "properties": {"timeout": TIMEOUT}},
    "WrittenFile": {
        "type": "object",
        "required": ["name", "type", "path"],
        "properties": {
            "name": {"type": "string"},
            "type": {"type": "string", "const": "file"},
            "path": {"type": "string"},
        },
    },
}

_ERRORS = {
    "default": {
        "description": "An error.",
        "content": {"application/json": {"schema": _ref("Error")}},
    }
}
_SANDBOX_ID = {"name": "sandboxID", "in": "path", "required": True, "schema": {"type": "string"}}
_ENVD_SANDBOX = {
    "name": "E2b-Sandbox-Id",
    "in": "header",
    "required": True,
    "schema": {"type": "string"},
    "description": "The sandbox envd serves.",
}
_PATH = {"name": "path", "in": "query", "required": True, "schema": {"type": "string"}}


def _query(name: str, schema: Schema, description: str) -> Schema:
    return {"name": name, "in": "query", "schema": schema, "description": description}


LIST_PARAMETERS = [
    _query("metadata", {"type": "string"}, "Form-encoded key=value pairs each sandbox has."),
    _query(
        "state",
        {"type": "string", "pattern": STATES_PATTERN},
        "Comma-separated: running, paused (none: running).",
    ),
    _query("startedAfter", {"type": "string", "format": "date-time"}, "Started at or after."),
    _query("template", {"type": "string"}, "A template's id or name."),
    _query("order", {"type": "string", "enum": ["asc", "desc"]}, "By creation (default desc)."),
    _query(
        "limit",
        {"type": "integer", "minimum": 1, "maximum": MAX_PAGE},
        f"Page size (v2: {MAX_PAGE} when absent; v1: every sandbox).",
    ),
    _query("nextToken", {"type": "string"}, "The x-next-token of the previous page."),
]


def _json(schema: Schema) -> Schema:
    return {"content": {"application/json": {"schema": schema}}}


def _answer(status: str, description: str, schema: Schema | None = None) -> Schema:
    answer: Schema = {"description": description}
    if schema is not None:
        answer.update(_json(schema))
    return {status: answer, **_ERRORS}


def _operation(operation_id: str, responses: Schema, **more: Any) -> Schema:
    return {"operationId": operation_id, "responses": responses, **more}


def _control_paths() -> dict[str, Schema]:
    create = _operation(
        "createSandbox",
        _answer("201", "Created, with its envd access token.", _ref("Sandbox")),
        requestBody={"required": True, **_json(_ref("NewSandbox"))},
        parameters=[
            {"name": "Idempotency-Key", "in": "header", "schema": {"type": "string"}},
        ],
    )
    listing = _operation(
        "listSandboxes",
        _answer(
            "200",
            "The organization's sandboxes.",
            {"type": "array", "items": _ref("ListedSandbox")},
        ),
        parameters=LIST_PARAMETERS,
    )
    paged = _answer(
        "200",
        "A page of the organization's sandboxes, newest first unless order=asc.",
        {"type": "array", "items": _ref("ListedSandbox")},
    )
    paged["200"]["headers"] = {
        "x-next-token": {
            "description": "The next page's nextToken; absent on the last page.",
            "schema": {"type": "string"},
        }
    }
    one = [_SANDBOX_ID]
    connect = _operation(
        "connectSandbox",
        _answer("200", "A fresh envd access token (a paused sandbox resumes).", _ref("Sandbox")),
        parameters=one,
        requestBody=_json(_ref("ConnectSandbox")),
    )
    return {
        "/sandboxes": {"post": create, "get": listing},
        "/v2/sandboxes": {
            "post": {**create, "operationId": "createSandboxV2"},
            "get": {**listing, "operationId": "listSandboxesV2", "responses": paged},
        },
        "/sandboxes/{sandboxID}": {
            "get": _operation(
                "getSandbox", _answer("200", "The sandbox.", _ref("SandboxDetail")), parameters=one
            ),
            "delete": _operation("killSandbox", _answer("204", "Destroyed."), parameters=one),
        },
        "/sandboxes/{sandboxID}/timeout": {
            "post": _operation(
                "setSandboxTimeout",
                _answer("204", "Its idle timeout set."),
                parameters=one,
                requestBody={"required": True, **_json(_ref("Timeout"))},
            )
        },
        "/sandboxes/{sandboxID}/pause": {
            "post": _operation(
                "pauseSandbox", _answer("204", "Paused, memory kept."), parameters=one
            )
        },
        "/sandboxes/{sandboxID}/connect": {"post": connect},
        "/v2/sandboxes/{sandboxID}/connect": {
            "post": {**connect, "operationId": "connectSandboxV2"}
        },
        "/files": {
            "get": _operation(
                "downloadFile",
                {
                    "200": {
                        "description": "The file's bytes.",
                        "content": {
                            "application/octet-stream": {
                                "schema": {"type": "string", "format": "binary"}
                            }
                        },
                    },
                    **_ERRORS,
                },
                parameters=[_ENVD_SANDBOX, _PATH],
            ),
            "post": _operation(
                "uploadFile",
                _answer(
                    "200", "What was written.", {"type": "array", "items": _ref("WrittenFile")}
                ),
                parameters=[_ENVD_SANDBOX, {**_PATH, "required": False}],
                requestBody={
                    "required": True,
                    "content": {
                        "application/octet-stream": {
                            "schema": {"type": "string", "format": "binary"}
                        },
                        "multipart/form-data": {
                            "schema": {
                                "type": "object",
                                "required": ["file"],
                                "properties": {"file": {"type": "string", "format": "binary"}},
                            }
                        },
                    },
                },
            ),
        },
        "/health": {
            "get": _operation(
                "envdHealth",
                {
                    "204": {"description": "The sandbox runs."},
                    "502": {
                        "description": "The sandbox stopped ('was not found').",
                        **_json(_ref("Error")),
                    },
                    **_ERRORS,
                },
                parameters=[_ENVD_SANDBOX],
            )
        },
    }


def _message_schemas(
    messages: list[tuple[str, type]], schemas: dict[str, Schema]
) -> dict[str, Schema]:
    """Each message's JSON form (a `$ref`) by key, generated together so that messages of the
    same short name (StreamInputRequest.DataEvent, ProcessEvent.DataEvent) get apart names;
    their definitions go into `schemas` as `envd.<name>`."""
    inputs: list[tuple[str, JsonSchemaMode, TypeAdapter[Any]]] = [
        (key, "validation", TypeAdapter(message)) for key, message in messages
    ]
    refs, top = TypeAdapter.json_schemas(inputs, ref_template=_REF + "envd.{model}")
    schemas.update({f"envd.{name}": body for name, body in top.get("$defs", {}).items()})
    return {key: ref for (key, _mode), ref in refs.items()}


def _python_message(module: Any, message: DescMessage) -> type:
    found: type = getattr(module, message.name)
    return found


def rpc_methods() -> Iterator[tuple[str, Any, Any]]:
    """(path, method descriptor, its pb module) of every RPC Sandpit serves."""
    for service, module in RPC_SERVICES:
        descriptor = service.desc()
        for method in descriptor.methods:
            yield f"/{descriptor.type_name}/{method.name}", method, module


def _rpc_paths(schemas: dict[str, Schema]) -> dict[str, Schema]:
    methods = list(rpc_methods())
    messages = _message_schemas(
        [
            (f"{path} {side}", _python_message(module, getattr(method, side)))
            for path, method, module in methods
            for side in ("input", "output")
        ],
        schemas,
    )
    connect_error = {"default": {"description": "A Connect error.", **_json(_ref("ConnectError"))}}
    stream = {"content": {CONNECT_STREAM: {"schema": {"type": "string", "format": "binary"}}}}
    paths: dict[str, Schema] = {}
    for path, method, _module in methods:
        request, answer = messages[f"{path} input"], messages[f"{path} output"]
        unary = method.method_kind == "unary"
        operation: Schema = {
            "operationId": path.strip("/").replace("/", "."),
            "parameters": [_ENVD_SANDBOX],
            "requestBody": {"required": True, **(_json(request) if unary else stream)},
            "responses": {
                "200": {
                    "description": "The answer."
                    if unary
                    else "Enveloped messages, then the end of the stream.",
                    **(_json(answer) if unary else stream),
                },
                **connect_error,
            },
        }
        if not unary:
            # What the envelopes carry, for clients (and the fuzz test) that frame them.
            operation["x-connect-stream"] = {
                "kind": str(method.method_kind),
                "request": request,
                "response": answer,
            }
        paths[path] = {"post": operation}
    return paths


@functools.cache
def e2b_openapi() -> Schema:
    schemas = dict(CONTROL_SCHEMAS)
    rpc = _rpc_paths(schemas)
    either: list[dict[str, list[str]]] = [{"ApiKey": []}, {"AccessToken": []}]
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Sandpit's E2B-compatible API",
            "version": translate.ENVD_VERSION,
            "description": "The part of E2B's control plane and envd that Sandpit serves, for "
            "the unmodified `e2b` SDK. Everything else under /e2b/ answers 501.",
        },
        "servers": [{"url": "/e2b"}],
        "security": either,
        "paths": {**_control_paths(), **rpc},
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "ApiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
                "AccessToken": {
                    "type": "apiKey",
                    "in": "header",
                    "name": "X-Access-Token",
                    "description": "The envd access token a create or connect answers.",
                },
            },
        },
    }
