"""REST views for snapshots, fork, pause and resume: parse, resolve tenancy, call one service
(sandboxes/snapshots.py), render. Not for sandbox tokens: a token's holder may use the
sandbox it was given, not copy it, stop its clock or restart it."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from accounts.permissions import principal_of
from common.errors import Forbidden
from common.inputs import InputSerializer
from common.pagination import CursorlessPagination
from common.schema_shapes import PAGE_PARAMETERS, page_of

from . import serializers as s
from . import snapshots
from .apis import SandboxApi
from .caller import Caller
from .models import Snapshot


class SnapshotCreateInput(InputSerializer):
    name = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=100,
        default="",
        help_text="Your label for the snapshot (at most 100 characters).",
    )


class SnapshotOutput(serializers.ModelSerializer):
    sandbox = serializers.CharField(
        source="source_sandbox_id", help_text="The sandbox it was taken from."
    )

    class Meta:
        model = Snapshot
        fields = [
            "id",
            "sandbox",
            "name",
            "kind",
            "state",
            "provider",
            "template",
            "size_bytes",
            "created_at",
        ]


def _no_tokens(request: Any) -> None:
    if principal_of(request).token is not None:
        raise Forbidden("Sandbox tokens cannot do this; use an API key.", code="token_not_allowed")


SNAPSHOT_PAGE = page_of("Snapshot", SnapshotOutput(many=True))


def _page(view: Any, request: Request, qs: Any) -> Response:
    paginator = CursorlessPagination()
    page = paginator.paginate_queryset(qs, request, view=view)
    return paginator.get_paginated_response(SnapshotOutput(page, many=True).data)


class SandboxSnapshotListApi(SandboxApi):
    """GET: the sandbox's snapshots (not counted). POST: take one (counted once)."""

    @extend_schema(
        operation_id="v1_sandboxes_snapshots_list",
        responses=SNAPSHOT_PAGE,
        parameters=PAGE_PARAMETERS,
    )
    def get(self, request: Request, sandbox_id: str) -> Response:
        sandbox = self.sandbox(request, sandbox_id)
        _no_tokens(request)
        return _page(
            self, request, snapshots.snapshots_for_org(sandbox.organization, sandbox=sandbox)
        )

    @extend_schema(request=SnapshotCreateInput, responses={201: SnapshotOutput})
    def post(self, request: Request, sandbox_id: str) -> HttpResponse:
        serializer = SnapshotCreateInput(data=request.data)
        serializer.is_valid(raise_exception=True)
        sandbox = self.sandbox(request, sandbox_id)
        _no_tokens(request)

        def run(caller: Caller) -> Response:
            made = snapshots.snapshot_create(
                caller=caller, sandbox=sandbox, name=serializer.validated_data["name"]
            )
            return Response(SnapshotOutput(made).data, status=status.HTTP_201_CREATED)

        return self.operate(request, run)


class SnapshotListApi(SandboxApi):
    """GET: the organization's snapshots, newest first (not counted)."""

    @extend_schema(
        operation_id="v1_snapshots_list", responses=SNAPSHOT_PAGE, parameters=PAGE_PARAMETERS
    )
    def get(self, request: Request) -> Response:
        _no_tokens(request)
        return _page(self, request, snapshots.snapshots_for_org(principal_of(request).organization))


class SnapshotDetailApi(SandboxApi):
    """GET: one snapshot (not counted). DELETE: remove it and its archive (not counted: it
    runs nothing and frees storage)."""

    @extend_schema(responses=SnapshotOutput)
    def get(self, request: Request, snapshot_id: str) -> Response:
        found = snapshots.snapshot_get_for_principal(
            principal=principal_of(request), snapshot_id=snapshot_id
        )
        return Response(SnapshotOutput(found).data)

    def delete(self, request: Request, snapshot_id: str) -> Response:
        found = snapshots.snapshot_get_for_principal(
            principal=principal_of(request), snapshot_id=snapshot_id
        )
        snapshots.snapshot_delete(snapshot=found)
        return Response(status=status.HTTP_204_NO_CONTENT)


class SandboxForkApi(SandboxApi):
    """POST: a new sandbox with a copy of this one's files (counted once)."""

    @extend_schema(request=None, responses={201: s.SandboxOutput})
    def post(self, request: Request, sandbox_id: str) -> HttpResponse:
        sandbox = self.sandbox(request, sandbox_id)
        _no_tokens(request)
        principal = principal_of(request)

        def run(caller: Caller) -> Response:
            fork = snapshots.sandbox_fork(caller=caller, principal=principal, sandbox=sandbox)
            return Response(s.SandboxOutput(fork).data, status=status.HTTP_201_CREATED)

        return self.operate(request, run)


class SandboxPauseApi(SandboxApi):
    """POST: freeze the sandbox's processes, memory kept (counted once)."""

    @extend_schema(request=None, responses=s.SandboxOutput)
    def post(self, request: Request, sandbox_id: str) -> HttpResponse:
        sandbox = self.sandbox(request, sandbox_id)
        _no_tokens(request)

        def run(caller: Caller) -> Response:
            snapshots.sandbox_pause(caller=caller, sandbox=sandbox)
            return Response(s.SandboxOutput(sandbox).data)

        return self.operate(request, run)


class SandboxResumeApi(SandboxApi):
    """POST: thaw a paused sandbox, or start an archived one from its archive (counted once)."""

    @extend_schema(request=None, responses=s.SandboxOutput)
    def post(self, request: Request, sandbox_id: str) -> HttpResponse:
        sandbox = self.sandbox(request, sandbox_id)
        _no_tokens(request)

        def run(caller: Caller) -> Response:
            snapshots.sandbox_resume(caller=caller, sandbox=sandbox)
            return Response(s.SandboxOutput(sandbox).data)

        return self.operate(request, run)
