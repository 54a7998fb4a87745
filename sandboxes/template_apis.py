"""Template REST endpoints: thin views over sandboxes/templates.py.

GET/POST /api/v1/templates, GET/DELETE /api/v1/templates/{id}, and the build log as a
chunked text stream, GET /api/v1/templates/{id}/log (?offset= to resume, ?follow=false for
what is there now). Only a build is counted; sandbox tokens reach none of these.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpResponse, StreamingHttpResponse
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiTypes,
    extend_schema,
    extend_schema_field,
)
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from accounts.permissions import principal_of
from common.errors import ApplicationError
from common.inputs import InputSerializer

from .apis import SandboxApi, _no_tokens, _validated
from .caller import Caller
from .models import BuildState, Template
from .serializers import StrictCharField
from .templates import (
    template_create,
    template_delete,
    template_get_for_org,
    template_progress,
    templates_for_org,
)

LOG_POLL_S = 0.5
FOLLOW_MARGIN_S = 60
"""A followed log ends at the latest this long after the build timeout, whatever happens."""


class TemplateCreateInput(InputSerializer):
    name = StrictCharField(
        max_length=64,
        help_text="Unique in the organization: lowercase letters, digits, '.', '_', '-'. "
        'Sandboxes name it in POST /api/v1/sandboxes {"template": ...}.',
    )
    dockerfile = StrictCharField(
        trim_whitespace=False,
        help_text="The Dockerfile (at most 64 KiB). FROM sandpit (the sandbox image), a "
        "built-in template (python, node, polyglot) or a ready template of the organization; "
        "no registry pulls, VOLUME, ONBUILD, ENTRYPOINT, RUN flags or ADD from URLs.",
    )
    description = StrictCharField(
        required=False, allow_blank=True, max_length=200, default="", help_text="Free text."
    )
    network = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Give the build's RUN steps network access (e.g. apt-get, pip install). "
        "Only a signed-in owner may ask for it; sandboxes are unaffected.",
    )


class ProgressOutput(serializers.Serializer):
    percent = serializers.IntegerField(help_text="0-100.")
    step = serializers.IntegerField(help_text="The Dockerfile step being built (1-based).")
    steps = serializers.IntegerField(help_text="Steps in the Dockerfile.")
    phase = serializers.CharField(
        help_text="queued, building, exporting, probing, ready or failed."
    )


class TemplateOutput(serializers.ModelSerializer):
    builtin = serializers.SerializerMethodField(help_text="A built-in template (not deletable).")
    progress = serializers.SerializerMethodField(help_text="How far the build is.")

    class Meta:
        model = Template
        fields = [
            "id",
            "name",
            "description",
            "builtin",
            "state",
            "progress",
            "languages",
            "size_bytes",
            "build_seconds",
            "error_message",
            "dockerfile",
            "created_at",
            "built_at",
        ]

    def get_builtin(self, template: Template) -> bool:
        return template.organization_id is None

    @extend_schema_field(ProgressOutput)
    def get_progress(self, template: Template) -> dict[str, Any]:
        return ProgressOutput(template_progress(template)).data


class TemplateListApi(SandboxApi):
    @extend_schema(responses=TemplateOutput(many=True))
    def get(self, request: Request) -> Response:
        principal = principal_of(request)
        _no_tokens(principal)
        return Response(TemplateOutput(templates_for_org(principal.organization), many=True).data)

    @extend_schema(request=TemplateCreateInput, responses={202: TemplateOutput})
    def post(self, request: Request) -> HttpResponse:
        principal = principal_of(request)
        _no_tokens(principal)
        data = _validated(TemplateCreateInput, request.data)

        def run(caller: Caller) -> Response:
            template = template_create(
                caller=caller,
                principal=principal,
                name=data["name"],
                dockerfile=data["dockerfile"],
                description=data.get("description", ""),
                network=data.get("network", False),
            )
            return Response(TemplateOutput(template).data, status=status.HTTP_202_ACCEPTED)

        return self.operate(request, run)


class _TemplateApi(SandboxApi):
    def template(self, request: Request, template_id: str) -> Template:
        principal = principal_of(request)
        _no_tokens(principal)
        return template_get_for_org(organization=principal.organization, template_id=template_id)


class TemplateDetailApi(_TemplateApi):
    @extend_schema(responses=TemplateOutput)
    def get(self, request: Request, template_id: str) -> Response:
        return Response(TemplateOutput(self.template(request, template_id)).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, template_id: str) -> Response:
        template = self.template(request, template_id)
        template_delete(principal=principal_of(request), template=template)
        return Response(status=status.HTTP_204_NO_CONTENT)


class TemplateLogApi(_TemplateApi):
    """The build log as text/plain, sent as it is written (chunked), from `offset`."""

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "offset", int, description="Characters of the log to skip (resume a stream)."
            ),
            OpenApiParameter(
                "follow",
                bool,
                description="true (default): keep sending until the build ends; false: what "
                "is there now.",
            ),
        ],
        responses={(200, "text/plain"): OpenApiTypes.STR},
    )
    def get(self, request: Request, template_id: str) -> StreamingHttpResponse:
        template = self.template(request, template_id)
        try:
            offset = max(0, int(request.query_params.get("offset", "0")))
        except ValueError:
            raise ApplicationError("offset must be an integer.", code="validation_error") from None
        follow = request.query_params.get("follow", "true").lower() not in ("0", "false", "no")
        response = StreamingHttpResponse(
            _log_stream(template.pk, offset, follow), content_type="text/plain; charset=utf-8"
        )
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # a proxy in front must not hold it back
        return response


def _read(template_id: str) -> tuple[str, str] | None:
    row = Template.objects.filter(pk=template_id).values_list("state", "build_log").first()
    return (row[0], row[1]) if row else None


async def _log_stream(template_id: str, offset: int, follow: bool) -> AsyncIterator[bytes]:
    """New log text every LOG_POLL_S until the build ends (or is deleted); bounded by the
    log's own cap and by the build timeout."""
    deadline = time.monotonic() + settings.SANDPIT_TEMPLATE_BUILD_TIMEOUT_S + FOLLOW_MARGIN_S
    read = sync_to_async(_read)  # the ORM, as database_sync_to_async runs it
    while True:
        row = await read(template_id)
        if row is None:
            return
        state, log = row
        if len(log) > offset:
            yield log[offset:].encode()
            offset = len(log)
        if not follow or state not in (BuildState.QUEUED, BuildState.BUILDING):
            return
        if time.monotonic() > deadline:
            return
        await asyncio.sleep(LOG_POLL_S)
