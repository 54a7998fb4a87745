"""Sandbox REST API: thin views over sandboxes.services (which meter every operation once).

A view parses, resolves tenancy (selectors), settles an Idempotency-Key (a replay is
answered here and never reaches a service), calls one service with the Caller, renders."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import IO, Any

from django.conf import settings
from django.http import HttpResponse
from django.http.response import HttpResponseBase
from django.utils.http import content_disposition_header
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import parsers, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.authentication import Principal
from accounts.permissions import principal_of
from common.errors import ApplicationError, Forbidden, PayloadTooLarge
from common.pagination import CursorlessPagination
from common.schema_shapes import PAGE_PARAMETERS, page_of, results_of

from . import api_schema, code_services, file_services, process_services, services
from . import serializers as s
from .api_schema import PATH_PARAM, PATH_REQUIRED_PARAM, RECURSIVE_PARAM, byte_offset_param
from .caller import Caller
from .idempotent_requests import once_per_key
from .models import Sandbox
from .selectors import sandbox_get_for_principal, sandboxes_for_org
from .snapshots import snapshot_get_for_principal

# `format` is DRF's renderer override (?format=json), accepted by every endpoint.
LIST_QUERY_PARAMETERS = frozenset({"state", "all", "limit", "offset", "format"})


class RawBytesParser(parsers.BaseParser):
    """PUT file content: the body is the file, whatever its media type."""

    media_type = "*/*"

    # DRF uses whatever parse returns as request.data; the stubs allow only a mapping.
    def parse(  # type: ignore[override]
        self,
        stream: IO[bytes] | None,
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> bytes:
        limit = settings.SANDPIT_MAX_FILE_BYTES
        data = stream.read(limit + 1) if stream is not None else b""
        if len(data) > limit:
            raise PayloadTooLarge(f"Files are limited to {limit} bytes.", code="file_too_large")
        return data


def _upload_body(request: Any) -> bytes:
    """A PUT's body, within the file limit. DRF parses only bodies that declare a
    Content-Length, so a chunked upload (which has none) would be stored empty: it is read
    here with the same parser (the request proxies the HttpRequest's read())."""
    if request.META.get("CONTENT_LENGTH"):
        return request.data if isinstance(request.data, bytes) else b""
    return bytes(RawBytesParser().parse(request))


def _validated(serializer_class: type[serializers.Serializer], data: Any) -> dict[str, Any]:
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


_SANDBOX_OUTPUT = s.SandboxOutput()
"""One serializer for every sandbox response (read, create, destroy, timeout), as a list
serializer reuses its child: a new ModelSerializer rebuilds its fields from the model on
every request (a quarter of a read's view time, 0.6 ms of CPU in a create);
to_representation keeps no state between calls."""


class SandboxApi(APIView):
    """Base of the sandbox endpoints.

    Order: validate → tenancy (404) → token scope (403) → Idempotency-Key replay → the
    service (billing authorization 402, the operation, one usage record on success).

    Sandbox tokens reach only the methods a view lists in `sandbox_token_methods`, with the
    view's `required_scope` (accounts.authentication.SandboxTokenAuthentication refuses the
    rest before the view runs).
    """

    required_scope: str | None = None
    sandbox_token_methods: frozenset[str] = frozenset()
    unmetered_methods: frozenset[str] = frozenset()
    """Methods that never bill, so the sandbox is read without its organization's row. A
    method missing here only costs a joined row; a wrong entry only a query of its own."""

    def sandbox(self, request: Any, sandbox_id: str) -> Sandbox:
        principal = principal_of(request)
        sandbox = sandbox_get_for_principal(
            principal=principal,
            sandbox_id=sandbox_id,
            with_organization=request.method not in self.unmetered_methods,
        )
        if self.required_scope and not principal.has_scope(self.required_scope):
            raise Forbidden(
                f"This token lacks the '{self.required_scope}' scope.", code="scope_missing"
            )
        return sandbox

    # The stubs type the response as DRF's Response; DRF takes and returns any HttpResponseBase.
    def finalize_response(  # type: ignore[override]
        self, request: Request, response: HttpResponseBase, *args: Any, **kwargs: Any
    ) -> HttpResponseBase:
        """Rendered here, on the request's thread, and handed on as a plain HttpResponse:
        Django's ASGI handler crosses to a thread once more just to render a response
        that renders late (a DRF Response is one), ~0.2 ms of a sandbox read."""
        response = super().finalize_response(request, response, *args, **kwargs)  # type: ignore[arg-type]
        if not isinstance(response, Response):
            return response
        response.render()
        return HttpResponse(
            response.content, status=response.status_code, headers=dict(response.items())
        )

    def operate(self, request: Any, run: Callable[[Caller], HttpResponse]) -> HttpResponse:
        """Run `run(caller)` once per Idempotency-Key (sandboxes/idempotent_requests.py)."""
        return once_per_key(request, run)


def _no_tokens(principal: Principal) -> None:
    if principal.token is not None:
        raise Forbidden("Sandbox tokens cannot do this; use an API key.", code="token_not_allowed")


# --- lifecycle -----------------------------------------------------------------------------


class SandboxListApi(SandboxApi):
    @extend_schema(
        operation_id="v1_sandboxes_list",
        responses=page_of("Sandbox", s.SandboxOutput(many=True)),
        parameters=[
            *PAGE_PARAMETERS,
            s.SandboxListQuery,
        ],
    )
    def get(self, request: Request) -> Response:
        unknown = sorted(set(request.query_params) - LIST_QUERY_PARAMETERS)
        if unknown:
            raise ApplicationError(
                f"Unknown query parameter {', '.join(unknown)}; known: "
                f"{', '.join(sorted(LIST_QUERY_PARAMETERS))}.",
                code="validation_error",
            )
        query = _validated(s.SandboxListQuery, request.query_params)
        principal = principal_of(request)
        qs = sandboxes_for_org(
            principal.organization, include_destroyed=query["all"], state=query.get("state")
        )
        if principal.token is not None:
            qs = qs.filter(pk=principal.token.sandbox_id)
        page = self.paginator.paginate_queryset(qs, request, view=self)
        return self.paginator.get_paginated_response(s.SandboxOutput(page, many=True).data)

    @property
    def paginator(self) -> CursorlessPagination:
        if not hasattr(self, "_paginator"):
            self._paginator = CursorlessPagination()
        return self._paginator

    @extend_schema(request=s.SandboxCreateInput, responses={201: s.SandboxOutput})
    def post(self, request: Request) -> HttpResponse:
        data = _validated(s.SandboxCreateInput, request.data)
        principal = principal_of(request)
        _no_tokens(principal)
        snapshot = None
        if data.get("snapshot"):  # its own provider unless one is asked for
            snapshot = snapshot_get_for_principal(principal=principal, snapshot_id=data["snapshot"])
        provider_name = (
            services.provider_name_check(data.get("provider"))
            if snapshot is None or data.get("provider")
            else None
        )

        def run(caller: Caller) -> Response:
            sandbox = services.sandbox_create(
                caller=caller,
                principal=principal,
                provider_name=provider_name,
                template=data.get("template") or "default",
                timeout_s=data.get("timeout_s"),
                network=data.get("network", False),
                resources=data.get("resources"),
                env=data.get("env"),
                metadata=data.get("metadata"),
                snapshot=snapshot,
            )
            return Response(
                _SANDBOX_OUTPUT.to_representation(sandbox), status=status.HTTP_201_CREATED
            )

        return self.operate(request, run)


class SandboxDetailApi(SandboxApi):
    sandbox_token_methods = frozenset({"GET"})
    unmetered_methods = frozenset({"GET"})

    @extend_schema(responses=s.SandboxOutput)
    def get(self, request: Request, sandbox_id: str) -> Response:
        return Response(_SANDBOX_OUTPUT.to_representation(self.sandbox(request, sandbox_id)))

    @extend_schema(responses={200: s.SandboxOutput})
    def delete(self, request: Request, sandbox_id: str) -> HttpResponse:
        sandbox = self.sandbox(request, sandbox_id)
        _no_tokens(principal_of(request))

        def run(caller: Caller) -> Response:
            # The winning destroy wrote the row's new state into `sandbox` too; another
            # request's destroy (or a pause) may have won instead, so read what it left.
            if not services.sandbox_destroy(caller=caller, sandbox=sandbox, reason="api"):
                sandbox.refresh_from_db()
            return Response(_SANDBOX_OUTPUT.to_representation(sandbox))

        return self.operate(request, run)


class SandboxTimeoutApi(SandboxApi):
    """Not for sandbox tokens: a token is handed to a less trusted party (a browser, an
    agent) for a bounded time, and letting it push back the sandbox's end would let it keep
    a billed sandbox alive past what its minter chose."""

    @extend_schema(request=s.TimeoutInput, responses=s.SandboxOutput)
    def post(self, request: Request, sandbox_id: str) -> HttpResponse:
        data = _validated(s.TimeoutInput, request.data)
        sandbox = self.sandbox(request, sandbox_id)

        def run(caller: Caller) -> Response:
            services.sandbox_set_timeout(
                caller=caller, sandbox=sandbox, timeout_s=data["timeout_s"]
            )
            return Response(_SANDBOX_OUTPUT.to_representation(sandbox))

        return self.operate(request, run)


class SandboxStatsApi(SandboxApi):
    """Resource gauges. Not counted: monitoring reads Sandpit's view of the sandbox and
    runs nothing in it, and an open playground polls it every few seconds."""

    sandbox_token_methods = frozenset({"GET"})
    unmetered_methods = frozenset({"GET"})

    @extend_schema(responses=api_schema.StatsOutput)
    def get(self, request: Request, sandbox_id: str) -> Response:
        sandbox = self.sandbox(request, sandbox_id)
        stats = services.sandbox_stats(sandbox=sandbox)
        return Response(dict(stats.__dict__))


# --- execution --------------------------------------------------------------------------------


class SandboxCommandApi(SandboxApi):
    required_scope = "exec"
    sandbox_token_methods = frozenset({"POST"})

    @extend_schema(
        request=s.CommandInput,
        responses={200: api_schema.ExecResultOutput, 202: api_schema.BackgroundStartOutput},
    )
    def post(self, request: Request, sandbox_id: str) -> HttpResponse:
        data = _validated(s.CommandInput, request.data)
        sandbox = self.sandbox(request, sandbox_id)

        def run(caller: Caller) -> Response:
            if data["background"]:
                info = process_services.sandbox_exec_background(
                    caller=caller,
                    sandbox=sandbox,
                    command=data["command"],
                    args=data.get("args"),
                    cwd=data.get("cwd"),
                    env=data.get("env"),
                )
                return Response(
                    {**s.process_data(info), "background": True}, status=status.HTTP_202_ACCEPTED
                )
            stdin = data.get("stdin")
            result = services.sandbox_exec(
                caller=caller,
                sandbox=sandbox,
                command=data["command"],
                args=data.get("args"),
                cwd=data.get("cwd"),
                env=data.get("env"),
                timeout_s=data.get("timeout_s"),
                stdin=stdin.encode() if stdin else None,
            )
            return Response(s.exec_result_data(result, data["encoding"]))

        return self.operate(request, run)


class SandboxCodeApi(SandboxApi):
    required_scope = "exec"
    sandbox_token_methods = frozenset({"POST"})

    @extend_schema(request=s.CodeInput, responses=api_schema.CodeRunOutput)
    def post(self, request: Request, sandbox_id: str) -> HttpResponse:
        data = _validated(s.CodeInput, request.data)
        language = code_services.resolve_language(data["code"], data.get("language"))
        sandbox = self.sandbox(request, sandbox_id)

        def run(caller: Caller) -> Response:
            stdin = data.get("stdin")
            code_run = code_services.sandbox_run_code(
                caller=caller,
                sandbox=sandbox,
                code=data["code"],
                language=language,
                timeout_s=data.get("timeout_s"),
                compile_timeout_s=data.get("compile_timeout_s"),
                stdin=stdin.encode() if stdin else None,
            )
            return Response(s.code_run_data(code_run, data["encoding"]))

        return self.operate(request, run)


class SandboxLanguagesApi(SandboxApi):
    """The languages the sandbox runs (its template's, probed once per environment). Not
    counted: a read of what the sandbox offers, like its detail."""

    required_scope = "exec"
    sandbox_token_methods = frozenset({"GET"})

    @extend_schema(
        operation_id="v1_sandboxes_languages_list",
        responses=results_of("Language", s.LanguageOutput(many=True)),
    )
    def get(self, request: Request, sandbox_id: str) -> Response:
        sandbox = self.sandbox(request, sandbox_id)
        found = code_services.sandbox_languages(sandbox=sandbox)
        return Response({"results": s.LanguageOutput(found, many=True).data})


# --- files --------------------------------------------------------------------------------------


class FilesApi(SandboxApi):
    required_scope = "files"
    sandbox_token_methods = frozenset({"GET", "DELETE"})

    @extend_schema(parameters=[PATH_PARAM, RECURSIVE_PARAM], responses=api_schema.FileListOutput)
    def get(self, request: Request, sandbox_id: str) -> HttpResponse:
        query = _validated(s.PathQuery, request.query_params)
        sandbox = self.sandbox(request, sandbox_id)

        def run(caller: Caller) -> Response:
            entries = file_services.sandbox_file_list(
                caller=caller,
                sandbox=sandbox,
                path=query["path"] or ".",
                recursive=query["recursive"],
            )
            return Response({"entries": [s.file_entry_data(e) for e in entries]})

        return self.operate(request, run)

    @extend_schema(parameters=[PATH_REQUIRED_PARAM, RECURSIVE_PARAM])
    def delete(self, request: Request, sandbox_id: str) -> HttpResponse:
        query = _validated(s.PathQuery, request.query_params)
        if not query["path"] or query["path"] in (".", "/workspace", "/workspace/"):
            raise ApplicationError(
                "Refusing to remove the workspace itself.", code="validation_error"
            )
        sandbox = self.sandbox(request, sandbox_id)

        def run(caller: Caller) -> Response:
            file_services.sandbox_file_remove(
                caller=caller, sandbox=sandbox, path=query["path"], recursive=query["recursive"]
            )
            return Response(status=status.HTTP_204_NO_CONTENT)

        return self.operate(request, run)


class FileContentApi(SandboxApi):
    required_scope = "files"
    sandbox_token_methods = frozenset({"GET", "PUT"})
    parser_classes = [RawBytesParser]

    @extend_schema(
        responses={(200, "application/octet-stream"): bytes},
        parameters=[
            PATH_REQUIRED_PARAM,
            byte_offset_param("offset", "First byte to read (default 0)."),
            byte_offset_param("length", "Bytes to read (default: to the end)."),
        ],
    )
    def get(self, request: Request, sandbox_id: str) -> HttpResponse:
        query = _validated(s.PathQuery, request.query_params)
        if not request.query_params.get("path"):
            # PathQuery defaults to the workspace, which listing wants and reading cannot use.
            raise ApplicationError(
                "path is required: GET .../files/content?path=<file>.", code="validation_error"
            )
        sandbox = self.sandbox(request, sandbox_id)

        def run(caller: Caller) -> HttpResponse:
            data = file_services.sandbox_file_read(
                caller=caller,
                sandbox=sandbox,
                path=query["path"],
                offset=query["offset"],
                length=query["length"],
            )
            response = HttpResponse(data, content_type="application/octet-stream")
            name = query["path"].rstrip("/").rsplit("/", 1)[-1]
            # RFC 6266: a name with control or non-ASCII characters goes in filename*=,
            # so a name the sandbox chose cannot break the header (CR, LF) or its quoting.
            response["Content-Disposition"] = content_disposition_header(False, name) or "inline"
            return response

        return self.operate(request, run)

    @extend_schema(
        parameters=[PATH_REQUIRED_PARAM],
        request={"application/octet-stream": bytes},
        responses={201: api_schema.FileEntryOutput},
    )
    def put(self, request: Request, sandbox_id: str) -> HttpResponse:
        query = _validated(s.PathQuery, request.query_params)
        if query["path"] in ("", "."):
            raise ApplicationError("A file path is required.", code="validation_error")
        sandbox = self.sandbox(request, sandbox_id)
        body = _upload_body(request)

        def run(caller: Caller) -> Response:
            entry = file_services.sandbox_file_write(
                caller=caller, sandbox=sandbox, path=query["path"], data=body
            )
            return Response(s.file_entry_data(entry), status=status.HTTP_201_CREATED)

        return self.operate(request, run)


class FileStatApi(SandboxApi):
    required_scope = "files"
    sandbox_token_methods = frozenset({"GET"})

    @extend_schema(parameters=[PATH_PARAM], responses=api_schema.FileEntryOutput)
    def get(self, request: Request, sandbox_id: str) -> HttpResponse:
        query = _validated(s.PathQuery, request.query_params)
        sandbox = self.sandbox(request, sandbox_id)

        def run(caller: Caller) -> Response:
            entry = file_services.sandbox_file_stat(
                caller=caller, sandbox=sandbox, path=query["path"]
            )
            return Response(s.file_entry_data(entry))

        return self.operate(request, run)


class FileExistsApi(SandboxApi):
    """A dedicated existence check: a stat's 404 would be ambiguous with a missing sandbox,
    and clients should not branch on error codes for an ordinary question."""

    required_scope = "files"
    sandbox_token_methods = frozenset({"GET"})

    @extend_schema(parameters=[PATH_PARAM], responses=s.ExistsOutput)
    def get(self, request: Request, sandbox_id: str) -> HttpResponse:
        query = _validated(s.PathQuery, request.query_params)
        sandbox = self.sandbox(request, sandbox_id)

        def run(caller: Caller) -> Response:
            found = file_services.sandbox_file_exists(
                caller=caller, sandbox=sandbox, path=query["path"]
            )
            return Response({"exists": found})

        return self.operate(request, run)


class MkdirApi(SandboxApi):
    required_scope = "files"
    sandbox_token_methods = frozenset({"POST"})

    @extend_schema(request=s.MkdirInput, responses={201: api_schema.FileEntryOutput})
    def post(self, request: Request, sandbox_id: str) -> HttpResponse:
        data = _validated(s.MkdirInput, request.data)
        sandbox = self.sandbox(request, sandbox_id)

        def run(caller: Caller) -> Response:
            entry = file_services.sandbox_mkdir(caller=caller, sandbox=sandbox, path=data["path"])
            return Response(s.file_entry_data(entry), status=status.HTTP_201_CREATED)

        return self.operate(request, run)


class MoveApi(SandboxApi):
    required_scope = "files"
    sandbox_token_methods = frozenset({"POST"})

    @extend_schema(request=s.MoveInput, responses=api_schema.FileEntryOutput)
    def post(self, request: Request, sandbox_id: str) -> HttpResponse:
        data = _validated(s.MoveInput, request.data)
        sandbox = self.sandbox(request, sandbox_id)

        def run(caller: Caller) -> Response:
            entry = file_services.sandbox_file_move(
                caller=caller, sandbox=sandbox, src=data["from"], dst=data["to"]
            )
            return Response(s.file_entry_data(entry))

        return self.operate(request, run)


# --- processes ------------------------------------------------------------------------------------


class ProcessListApi(SandboxApi):
    required_scope = "exec"
    sandbox_token_methods = frozenset({"GET", "POST"})

    @extend_schema(responses=results_of("Process", api_schema.ProcessOutput(many=True)))
    def get(self, request: Request, sandbox_id: str) -> HttpResponse:
        sandbox = self.sandbox(request, sandbox_id)

        def run(caller: Caller) -> Response:
            processes = process_services.sandbox_process_list(caller=caller, sandbox=sandbox)
            return Response({"results": [s.process_data(p) for p in processes]})

        return self.operate(request, run)

    @extend_schema(request=s.ProcessStartInput, responses={201: api_schema.ProcessOutput})
    def post(self, request: Request, sandbox_id: str) -> HttpResponse:
        data = _validated(s.ProcessStartInput, request.data)
        sandbox = self.sandbox(request, sandbox_id)

        def run(caller: Caller) -> Response:
            info = process_services.sandbox_process_start(
                caller=caller,
                sandbox=sandbox,
                command=data["command"],
                args=data.get("args"),
                cwd=data.get("cwd"),
                env=data.get("env"),
            )
            return Response(s.process_data(info), status=status.HTTP_201_CREATED)

        return self.operate(request, run)


class ProcessSignalApi(SandboxApi):
    required_scope = "exec"
    sandbox_token_methods = frozenset({"POST"})

    @extend_schema(request=s.SignalInput, responses=api_schema.SignalOutput)
    def post(self, request: Request, sandbox_id: str, pid: int) -> HttpResponse:
        data = _validated(s.SignalInput, request.data)
        process_services.parse_signal(data["signal"])  # 400 before tenancy, as for any bad input
        sandbox = self.sandbox(request, sandbox_id)

        def run(caller: Caller) -> Response:
            process_services.sandbox_process_signal(
                caller=caller, sandbox=sandbox, pid=pid, signal=data["signal"]
            )
            return Response({"pid": pid, "signal": data["signal"]})

        return self.operate(request, run)


class ProcessOutputApi(SandboxApi):
    """The output a background command (POST .../commands with background true) wrote."""

    required_scope = "exec"
    sandbox_token_methods = frozenset({"GET"})

    @extend_schema(
        responses=api_schema.BackgroundOutputOutput,
        parameters=[
            byte_offset_param("stdout_offset", "Bytes of stdout already read."),
            byte_offset_param("stderr_offset", "Bytes of stderr already read."),
            OpenApiParameter(
                "encoding",
                str,
                enum=list(s.OUTPUT_ENCODINGS),
                description='"utf-8" text (the default) or "base64" of the exact bytes.',
            ),
        ],
    )
    def get(self, request: Request, sandbox_id: str, pid: int) -> HttpResponse:
        query = _validated(s.BackgroundOutputQuery, request.query_params)
        sandbox = self.sandbox(request, sandbox_id)

        def run(caller: Caller) -> Response:
            output = process_services.sandbox_background_output(
                caller=caller,
                sandbox=sandbox,
                pid=pid,
                stdout_offset=query["stdout_offset"],
                stderr_offset=query["stderr_offset"],
            )
            return Response(
                s.background_output_data(
                    pid,
                    output,
                    stdout_offset=query["stdout_offset"],
                    stderr_offset=query["stderr_offset"],
                    encoding=query["encoding"],
                )
            )

        return self.operate(request, run)


# --- tokens, one-shot runs, providers -----------------------------------------------------------


class SandboxTokenApi(SandboxApi):
    @extend_schema(request=s.TokenInput, responses={201: api_schema.TokenOutput})
    def post(self, request: Request, sandbox_id: str) -> HttpResponse:
        data = _validated(s.TokenInput, request.data)
        sandbox = self.sandbox(request, sandbox_id)
        principal = principal_of(request)
        _no_tokens(principal)

        def run(caller: Caller) -> Response:
            token, expires_at = services.sandbox_token_mint(
                caller=caller, sandbox=sandbox, scopes=data["scopes"], ttl_s=data["ttl_s"]
            )
            return Response(
                {
                    "token": token,
                    "scopes": sorted(set(data["scopes"])),
                    "expires_at": expires_at.isoformat(),
                },
                status=status.HTTP_201_CREATED,
            )

        return self.operate(request, run)
