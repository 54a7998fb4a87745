"""E2B's control plane (sandboxes) and envd's plain HTTP endpoints (/files, /health).

Thin DRF views: authenticate (X-API-Key or the envd access token), resolve tenancy, call one
Sandpit service, render E2B's shapes. Errors leave in E2B's shape, `{"code": <HTTP status>,
"message": ...}`, which the SDK turns into its own exceptions, plus Sandpit's `error` object.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.http import HttpResponse
from rest_framework import parsers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.permissions import principal_of
from common.errors import ApplicationError, Conflict
from common.exception_handler import api_exception_handler
from sandboxes import file_services, services, snapshots
from sandboxes.apis import RawBytesParser
from sandboxes.caller import Caller
from sandboxes.idempotent_requests import once_per_key
from sandboxes.models import Sandbox, SandboxState
from sandboxes.providers.base import FileNotFound
from sandboxes.selectors import sandbox_get_for_principal

from . import translate
from .auth import ENVD_SCOPES, SANDBOX_ID_HEADER, E2BAuthentication
from .listing import listing_read, sandboxes_listed


def e2b_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """Sandpit's one translation of errors, reshaped for the SDK: E2B's `code` (the HTTP
    status) and `message` at the top, Sandpit's `error` object kept beside them."""
    response = api_exception_handler(exc, context)
    if response is not None and isinstance(response.data, dict) and "error" in response.data:
        response.data = {
            "code": response.status_code,
            "message": response.data["error"]["message"],
            **response.data,
        }
    return response


class E2BApi(APIView):
    authentication_classes = [E2BAuthentication]
    # E2B's own API specification describes these; Sandpit's OpenAPI schema is its own API.
    schema = None

    def get_exception_handler(self) -> Callable[[Exception, dict[str, Any]], Response | None]:
        return e2b_exception_handler

    def caller(self, request: Request) -> Caller:
        return Caller(principal_of(request))

    def sandbox(self, request: Request, sandbox_id: str) -> Sandbox:
        return sandbox_get_for_principal(principal=principal_of(request), sandbox_id=sandbox_id)

    def live_sandbox(
        self, request: Request, sandbox_id: str, *, paused_too: bool = False
    ) -> Sandbox:
        sandbox = self.sandbox(request, sandbox_id)
        translate.require_running(sandbox, paused_too=paused_too)
        return sandbox


def _access_token(caller: Caller, sandbox: Any) -> str:
    """The envd access token: a Sandpit sandbox token for this one sandbox, living as long
    as the sandbox may. Minted as a step of the operation that hands it out (not counted on
    its own)."""
    token, _ = services.sandbox_token_mint(
        caller=caller.unbilled(),
        sandbox=sandbox,
        scopes=list(ENVD_SCOPES),
        ttl_s=settings.SANDPIT_MAX_LIFETIME_S,
    )
    return token


def _object_body(request: Request) -> dict[str, Any]:
    """The request's JSON object (no body: {}); a body of another type is the client's
    mistake, not an empty request."""
    if not isinstance(request.data, dict):
        raise ApplicationError("The body must be a JSON object.")
    return request.data


def _optional(body: dict[str, Any], name: str, kind: type, what: str) -> Any:
    """`body[name]` when it is a `kind` (None when absent or null), else 400."""
    value = body.get(name)
    if value is not None and (
        not isinstance(value, kind) or isinstance(value, bool) != (kind is bool)
    ):
        raise ApplicationError(f"{name} must be {what}.")
    return value


def _timeout_s(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ApplicationError("timeout must be a whole number of seconds.")
    return max(1, min(value, settings.SANDPIT_MAX_LIFETIME_S))


def _string_map(value: Any, name: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ApplicationError(f"{name} must be an object of strings.")
    return value


class SandboxesApi(E2BApi):
    """POST /v2/sandboxes (and /sandboxes): create. GET /v2/sandboxes (and /sandboxes): list."""

    paged = False  # GET /v2/sandboxes: True (urls.py)

    def post(self, request: Request) -> HttpResponse:
        """Create; once per Idempotency-Key, as Sandpit's own create (a retry of one that
        finished gets its stored answer, Idempotent-Replayed: true, and creates nothing)."""
        body = _object_body(request)
        principal = principal_of(request)
        provider_name, template = translate.template_resolve(
            _optional(body, "templateID", str, "a template's name") or "", principal.organization
        )

        def create(caller: Caller) -> HttpResponse:
            sandbox = services.sandbox_create(
                principal=principal,
                provider_name=provider_name,
                template=template,
                timeout_s=_timeout_s(body.get("timeout")),
                network=_optional(body, "allow_internet_access", bool, "true or false") is True,
                env=_string_map(body.get("envVars"), "envVars"),
                metadata=_string_map(body.get("metadata"), "metadata"),
                caller=caller,
            )
            token = _access_token(caller, sandbox)
            return Response(
                translate.sandbox_created(sandbox, access_token=token),
                status=status.HTTP_201_CREATED,
            )

        return once_per_key(request, create)

    def get(self, request: Request) -> Response:
        """E2B's list query (listing.py); the v2 list answers pages, the next one's token in
        `x-next-token`."""
        listing = listing_read(request.query_params, paged=self.paged)
        page, next_token = sandboxes_listed(principal_of(request), listing)
        headers = {"x-next-token": next_token} if next_token else None
        return Response(page, headers=headers)


class SandboxApi(E2BApi):
    """GET /sandboxes/{id}: info (not counted). DELETE: kill (counted once)."""

    def get(self, request: Request, sandbox_id: str) -> Response:
        sandbox = self.live_sandbox(request, sandbox_id, paused_too=True)
        return Response(translate.sandbox_detail(sandbox))

    def delete(self, request: Request, sandbox_id: str) -> Response:
        sandbox = self.live_sandbox(request, sandbox_id, paused_too=True)
        services.sandbox_destroy(sandbox=sandbox, reason="api", caller=self.caller(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


class SandboxTimeoutApi(E2BApi):
    """POST /sandboxes/{id}/timeout {"timeout": s}: set_timeout (counted once)."""

    def post(self, request: Request, sandbox_id: str) -> Response:
        sandbox = self.live_sandbox(request, sandbox_id)
        body = _object_body(request)
        timeout_s = _timeout_s(body.get("timeout"))
        if timeout_s is None:
            raise ApplicationError("timeout is required.")
        services.sandbox_set_timeout(
            caller=self.caller(request), sandbox=sandbox, timeout_s=timeout_s
        )
        return Response(status=status.HTTP_204_NO_CONTENT)


class SandboxConnectApi(E2BApi):
    """POST /v2/sandboxes/{id}/connect (and /sandboxes/{id}/connect): a fresh envd access
    token for a running sandbox, counted once as the token it mints; a longer `timeout`
    extends the sandbox as a step of the same operation."""

    def post(self, request: Request, sandbox_id: str) -> Response:
        sandbox = self.live_sandbox(request, sandbox_id, paused_too=True)
        body = _object_body(request)
        caller = self.caller(request)
        if sandbox.state != SandboxState.RUNNING:
            # E2B's connect resumes a paused sandbox: then the resume is the counted
            # operation and the token a step of it.
            snapshots.sandbox_resume(caller=caller, sandbox=sandbox)
            caller = caller.unbilled()
        token, _ = services.sandbox_token_mint(
            caller=caller,
            sandbox=sandbox,
            scopes=list(ENVD_SCOPES),
            ttl_s=settings.SANDPIT_MAX_LIFETIME_S,
        )
        timeout_s = _timeout_s(body.get("timeout"))
        if timeout_s is not None and timeout_s > sandbox.timeout_s:
            services.sandbox_set_timeout(
                caller=caller.unbilled(), sandbox=sandbox, timeout_s=timeout_s
            )
        return Response(translate.sandbox_created(sandbox, access_token=token))


class SandboxPauseApi(E2BApi):
    """POST /sandboxes/{id}/pause: freeze it, memory kept (counted once); 409 when it is
    already paused, as E2B answers."""

    def post(self, request: Request, sandbox_id: str) -> Response:
        sandbox = self.live_sandbox(request, sandbox_id, paused_too=True)
        if sandbox.state != SandboxState.RUNNING:
            raise Conflict(f"Sandbox {sandbox_id} is already paused.", code="already_paused")
        snapshots.sandbox_pause(caller=self.caller(request), sandbox=sandbox)
        return Response(status=status.HTTP_204_NO_CONTENT)


class NotSupportedApi(E2BApi):
    """Everything else under /e2b/ (E2B's snapshots and fork, templates, volumes, secrets,
    network rules...): Sandpit has no such thing, and says so in E2B's shape."""

    def _refuse(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        path = request.path.removeprefix("/e2b")
        return Response(
            {
                "code": 501,
                "message": f"{request.method} {path} is not supported by Sandpit's E2B-compatible "
                "API (no E2B snapshots or fork, template builds, volumes or secrets).",
                "error": {"code": "not_supported", "message": "Not supported by Sandpit."},
            },
            status=status.HTTP_501_NOT_IMPLEMENTED,
        )

    get = post = put = patch = delete = _refuse


# --- envd's plain HTTP endpoints -------------------------------------------------------------


class EnvdApi(E2BApi):
    def envd_sandbox(self, request: Request) -> Sandbox:
        return self.sandbox(request, request.headers.get(SANDBOX_ID_HEADER, ""))


class HealthApi(EnvdApi):
    """GET /health: 204 while the sandbox runs; the 502 'was not found' the SDK reads as
    `is_running() == False` once it stopped. Not counted (runs nothing)."""

    def get(self, request: Request) -> Response:
        sandbox = self.envd_sandbox(request)
        if sandbox.state != SandboxState.RUNNING:
            return Response(
                {"code": 502, "message": f"The sandbox {sandbox.id} was not found"},
                status=status.HTTP_502_BAD_GATEWAY,
            )
        return Response(status=status.HTTP_204_NO_CONTENT)


def _write_info(path: str) -> dict[str, str]:
    return {"name": path.rstrip("/").rsplit("/", 1)[-1], "type": "file", "path": path}


class FilesApi(EnvdApi):
    """GET /files?path=: download (files.read). POST /files?path=: upload, an octet-stream
    body or multipart parts named by path (files.write). One count per file."""

    parser_classes = [parsers.MultiPartParser, RawBytesParser]

    def get(self, request: Request) -> HttpResponse:
        sandbox = self.envd_sandbox(request)
        translate.require_running(sandbox)
        path = request.query_params.get("path", "")
        try:
            data = file_services.sandbox_file_read(
                caller=self.caller(request), sandbox=sandbox, path=translate.sandbox_path(path)
            )
        except FileNotFound:
            raise ApplicationError(
                f"path '{path}' does not exist", code="file_not_found", status_code=404
            ) from None
        return HttpResponse(data, content_type="application/octet-stream")

    def post(self, request: Request) -> Response:
        sandbox = self.envd_sandbox(request)
        translate.require_running(sandbox)
        caller = self.caller(request)
        uploads: list[tuple[str, bytes]] = []
        path = request.query_params.get("path")
        if isinstance(request.data, bytes):
            if not path:
                raise ApplicationError("path is required.")
            uploads.append((path, request.data))
        else:
            for upload in request.FILES.getlist("file"):
                uploads.append((path or upload.name, upload.read()))
        if not uploads:
            raise ApplicationError("No file in the request.")
        written = []
        for name, data in uploads:
            target = translate.sandbox_path(name)
            entry = file_services.sandbox_file_write(
                caller=caller, sandbox=sandbox, path=target, data=data
            )
            written.append(_write_info(translate.e2b_path(entry.path)))
        return Response(written)
