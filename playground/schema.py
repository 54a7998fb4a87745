"""OpenAPI generation: our auth classes described, and APIViews without a serializer tolerated."""

from __future__ import annotations

import re
from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiParameter

# Every path parameter of the API, described once rather than on each of the views using it.
PATH_PARAMETERS: dict[str, tuple[type, str]] = {
    "sandbox_id": (str, "The sandbox's id, as create and list return it (sbx_...)."),
    "terminal_id": (str, "The terminal's id, as terminal create and list return it."),
    "pid": (int, "A process id, as process start and list return it."),
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
