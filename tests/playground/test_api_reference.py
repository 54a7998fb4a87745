"""The API reference cannot fall behind the code: every input field of every /api/ endpoint
carries a description in the OpenAPI schema, every input serializer refuses fields it does
not declare, and the README's API sections name every endpoint of the schema."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from drf_spectacular.generators import EndpointEnumerator, SchemaGenerator
from drf_spectacular.plumbing import ComponentRegistry, build_mock_request, force_instance
from rest_framework import serializers

from common.inputs import InputSerializer

README = Path(__file__).resolve().parents[2] / "README.md"
BODY_METHODS = ("post", "put", "patch")

# POSTs that take no body, by design (the URL says everything).
BODILESS = {
    ("post", "/api/v1/invitations/{invitation_id}/resend"): "the invitation is in the URL",
    ("post", "/api/v1/sandboxes/{sandbox_id}/pause"): "the sandbox is in the URL",
    ("post", "/api/v1/sandboxes/{sandbox_id}/resume"): "the sandbox is in the URL",
    ("post", "/api/v1/sandboxes/{sandbox_id}/fork"): "the sandbox is in the URL",
}


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return SchemaGenerator().get_schema(request=None, public=True)


def _api_operations(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method, path, operation)
        for path, item in schema["paths"].items()
        if path.startswith("/api/")
        for method, operation in item.items()
        if method in ("get", "post", "put", "patch", "delete")
    ]


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[-1]]
    return node


def _undescribed(schema: dict[str, Any], node: dict[str, Any], where: str) -> list[str]:
    """Properties without a description, nested objects and lists of objects included."""
    node = _resolve(schema, node)
    missing = []
    for name, prop in node.get("properties", {}).items():
        inner = prop
        if "allOf" in prop:  # a described $ref is wrapped as allOf: [$ref] + description
            inner = prop["allOf"][0]
        if not (prop.get("description") or _resolve(schema, inner).get("description")):
            missing.append(f"{where}.{name}")
        resolved = _resolve(schema, inner)
        if resolved.get("type") == "array":
            resolved = _resolve(schema, resolved.get("items", {}))
        if resolved.get("properties"):
            missing.extend(_undescribed(schema, resolved, f"{where}.{name}"))
    return missing


def test_every_body_endpoint_declares_its_body(schema):  # type: ignore[no-untyped-def]
    undeclared = [
        f"{method.upper()} {path}"
        for method, path, operation in _api_operations(schema)
        if method in BODY_METHODS
        and "requestBody" not in operation
        and (method, path) not in BODILESS
    ]
    assert not undeclared, undeclared


def test_every_input_field_and_query_parameter_is_described(schema):  # type: ignore[no-untyped-def]
    missing: list[str] = []
    for method, path, operation in _api_operations(schema):
        where = f"{method.upper()} {path}"
        for content in operation.get("requestBody", {}).get("content", {}).values():
            missing.extend(_undescribed(schema, content.get("schema", {}), where))
        for parameter in operation.get("parameters", []):
            if not parameter.get("description"):
                missing.append(f"{where} ?{parameter['name']} ({parameter['in']})")
    assert not missing, "help_text on the serializer field, or description= on the " + (
        "OpenApiParameter, for:\n" + "\n".join(missing)
    )


def _request_serializers() -> list[tuple[str, serializers.Serializer]]:
    """Each /api/ operation's request serializer, as drf-spectacular finds it (the steps of
    its generator, through public methods)."""
    generator = SchemaGenerator()
    registry = ComponentRegistry()
    found = []
    for path, path_regex, method, callback in EndpointEnumerator().get_api_endpoints():
        if not path.startswith("/api/") or method.lower() not in BODY_METHODS:
            continue
        view = generator.create_view(callback, method)
        view.request = build_mock_request(method, path, view, None)
        view.schema.get_operation(path, path_regex, "^/api/", method, registry)
        serializer = force_instance(view.schema.get_request_serializer())
        if isinstance(serializer, serializers.Serializer):
            found.append((f"{method} {path}", serializer))
    return found


def _nested_serializers(
    serializer: serializers.Serializer,
) -> list[serializers.Serializer]:
    nested = [serializer]
    for field in serializer.fields.values():
        child = field.child if isinstance(field, serializers.ListSerializer) else field
        if isinstance(child, serializers.Serializer):
            nested.extend(_nested_serializers(child))
    return nested


def test_every_input_serializer_refuses_unknown_fields():  # type: ignore[no-untyped-def]
    found = _request_serializers()
    assert len(found) >= 15, found  # the walk reached the API's body endpoints
    lenient = [
        f"{where}: {type(inner).__name__}"
        for where, serializer in found
        for inner in _nested_serializers(serializer)
        if not isinstance(inner, InputSerializer)
    ]
    assert not lenient, lenient


def _readme_endpoints() -> set[tuple[str, str]]:
    """(method, path template) pairs the README names: `GET/DELETE /api/v1/x`, `GET|POST
    /api/v1/y`, and `POST .../z`, where `...` stands for `/api/v1/sandboxes/{id}` (the README
    says so above its table)."""
    named: set[tuple[str, str]] = set()
    for methods, target in re.findall(
        r"\b((?:GET|POST|PUT|PATCH|DELETE)(?:[/|](?:GET|POST|PUT|PATCH|DELETE))*) +"
        r"(/api/v1/[\w{}.\-/]*|\.\.\./[\w{}.\-/]*)",
        README.read_text(),
    ):
        path = target.replace("...", "/api/v1/sandboxes/{id}", 1).rstrip("./")
        for method in re.split(r"[/|]", methods):
            named.add((method.lower(), re.sub(r"\{\w+\}", "{}", path)))
    return named


# Named in the README by prose rather than "METHOD /path", or deliberately left out.
README_EXCEPTIONS: dict[tuple[str, str], str] = {}


def test_readme_names_every_api_endpoint(schema):  # type: ignore[no-untyped-def]
    named = _readme_endpoints()
    missing = [
        f"{method.upper()} {path}"
        for method, path, _ in _api_operations(schema)
        if (method, re.sub(r"\{\w+\}", "{}", path)) not in named
        and (method, path) not in README_EXCEPTIONS
    ]
    assert not missing, "name these in README.md's API section as `METHOD /api/v1/...`:\n" + (
        "\n".join(missing)
    )
