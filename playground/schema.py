"""OpenAPI generation: our auth classes described, and APIViews without a serializer tolerated."""

from __future__ import annotations

import re
from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiParameter

from sandboxes.url_converters import PID_MAX

# Every path parameter of the API, described once rather than on each of the views using it.
PATH_PARAMETERS: dict[str, tuple[type | dict[str, Any], str]] = {
    "sandbox_id": (str, "The sandbox's id, as create and list return it (sbx_...)."),
    "terminal_id": (str, "The terminal's id, as terminal create and list return it."),
    "pid": (
        {"type": "integer", "minimum": 1, "maximum": PID_MAX},
        "A process id, as process start and list return it.",
    ),
    "invoice_id": (int, "The invoice's id, as the invoice list returns it."),
    "key_id": (int, "The API key's id, as the key list returns it."),
    "member_id": (int, "The membership's id, as the member list returns it."),
    "invitation_id": (int, "The invitation's id, as the invitation list returns it."),
    "snapshot_id": (str, "The snapshot's id, as snapshot create and list return it (snp_...)."),
    "template_id": (str, "The template's id, as template create and list return it (tpl_...)."),
}


class SandpitAutoSchema(AutoSchema):
    def get_override_parameters(self) -> list[Any]:
        # drf-spectacular's hook for parameters; @extend_schema's own come after these.
        described = [
            OpenApiParameter(
                name,
                type=PATH_PARAMETERS[name][0],
                location=OpenApiParameter.PATH,
                required=True,
                description=PATH_PARAMETERS[name][1],
            )
            for name in re.findall(r"\{(\w+)\}", self.path)
            if name in PATH_PARAMETERS
        ]
        return described + list(super().get_override_parameters())

    def get_auth(self) -> list[dict[str, list[str]]]:
        # Only the credentials this operation takes: a sandbox token where the view lists the
        # method (the gate in accounts/authentication.py), an API key unless a permission
        # refuses it (`refused_credentials`, accounts/permissions.py).
        refused = {
            scheme
            for permission in self.view.get_permissions()
            for scheme in getattr(permission, "refused_credentials", ())
        }
        if self.method.upper() not in getattr(self.view, "sandbox_token_methods", ()):
            refused.add("SandboxToken")
        return [
            requirement
            for requirement in super().get_auth()
            if not refused.intersection(requirement)
        ]

    def _get_serializer(self) -> Any:
        # Thin APIViews declare bodies with @extend_schema where the shape matters; the rest
        # return small JSON objects documented in the README instead of warning at check time.
        view = self.view
        if not hasattr(view, "get_serializer") and not hasattr(view, "serializer_class"):
            return None
        return super()._get_serializer()


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "accounts.authentication.ApiKeyAuthentication"
    name = "ApiKey"

    def get_security_definition(self, auto_schema: AutoSchema) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An organization API key, sp_...",
        }


class SandboxTokenAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "accounts.authentication.SandboxTokenAuthentication"
    name = "SandboxToken"

    def get_security_definition(self, auto_schema: AutoSchema) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}


class SessionAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "accounts.authentication.SessionAuthentication"
    name = "Session"

    def get_security_definition(self, auto_schema: AutoSchema) -> dict[str, str]:
        return {"type": "apiKey", "in": "cookie", "name": "sessionid"}


ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Every error the API answers, whatever its status.",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "code": {
                    "type": "string",
                    "description": "Stable and machine-readable: not_found, invalid_request, "
                    "quota_exceeded, ...",
                },
                "message": {"type": "string", "description": "For people: what to do next."},
                "details": {"description": "Per-field problems, where a body was invalid."},
            },
            "required": ["code", "message"],
        }
    },
    "required": ["error"],
}
ERROR_RESPONSE_DESCRIPTION = (
    "An error, in the one shape every error has: 400 for a malformed or invalid request, 401 "
    "without valid credentials, 402 past the spending cap, 403 when the credentials may not do "
    "this, 404 for an object the caller cannot see, 409 for a conflict with the object's state, "
    "413 for a body over the limit and 503 server_stopping while the server stops (both "
    "answered by the web server itself), 429 past a rate or quota limit, 502 or 503 when a "
    "provider fails."
)


def document_errors(result: dict[str, Any], **_kwargs: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: every operation's other answers are the error
    shape (the `default` response), so clients and fuzzers know what an error looks like;
    and request bodies admit no fields they do not declare, as every input serializer
    refuses them (common/inputs.py)."""
    components = result.setdefault("components", {}).setdefault("schemas", {})
    components["Error"] = ERROR_SCHEMA
    for path_item in result.get("paths", {}).values():
        for operation in path_item.values():
            if isinstance(operation, dict) and "responses" in operation:
                for content in operation.get("requestBody", {}).get("content", {}).values():
                    _closed(content.get("schema", {}), components, set())
                operation["responses"].setdefault(
                    "default",
                    {
                        "description": ERROR_RESPONSE_DESCRIPTION,
                        "content": {
                            "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
                        },
                    },
                )
    return result


def _closed(node: dict[str, Any], components: dict[str, Any], seen: set[str]) -> None:
    """`additionalProperties: false` on `node` and the objects it holds, following refs."""
    ref = node.get("$ref", "")
    if ref:
        name = ref.rsplit("/", 1)[-1]
        if name in seen or name not in components:
            return
        seen.add(name)
        node = components[name]
    for nested in (*node.get("allOf", ()), *node.get("oneOf", ()), *node.get("anyOf", ())):
        _closed(nested, components, seen)
    if "properties" in node:
        node.setdefault("additionalProperties", False)
        for prop in node["properties"].values():
            _closed(prop, components, seen)
    if isinstance(node.get("items"), dict):
        _closed(node["items"], components, seen)
