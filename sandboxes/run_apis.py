"""One-shot runs (`POST /api/v1/run`) and the provider list: the organization-wide
operations beside the per-sandbox ones of sandboxes/apis.py."""

from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.permissions import principal_of
from common.schema_shapes import results_of

from . import api_schema, code_services, services
from . import serializers as s
from .apis import SandboxApi, _no_tokens, _validated
from .caller import Caller


class RunApi(SandboxApi):
    @extend_schema(request=s.RunInput, responses=api_schema.RunOutput)
    def post(self, request: Request) -> HttpResponse:
        data = _validated(s.RunInput, request.data)
        principal = principal_of(request)
        _no_tokens(principal)
        if data.get("code") is not None:
            code_services.resolve_language(data["code"], data.get("language"))

        def run(caller: Caller) -> Response:
            stdin = data.get("stdin")
            outcome = code_services.run_once(
                caller=caller,
                code=data.get("code"),
                command=data.get("command"),
                language=data.get("language"),
                files=data.get("files") or {},
                stdin=stdin.encode() if stdin else None,
                limits=data.get("limits") or {},
                provider_name=data.get("provider"),
            )
            result = outcome.result
            return Response(
                {
                    **s.exec_result_data(result),
                    "verdict": outcome.verdict,
                    "language": outcome.language,
                    "compile": s.compile_data(outcome.compile),
                    "cpu_time_ms": result.cpu_time_ms,
                    "peak_memory_bytes": result.peak_memory_bytes,
                }
            )

        return self.operate(request, run)


class ProviderListApi(APIView):
    @extend_schema(responses=results_of("Provider", api_schema.ProviderOutput(many=True)))
    def get(self, request: Request) -> Response:
        organization = principal_of(request).organization
        return Response({"results": services.providers_describe(organization)})
