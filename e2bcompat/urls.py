"""/e2b/...: E2B's control plane and envd's HTTP endpoints (the RPC services are routed in
e2bcompat/asgi.py, in front of Django)."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.urls import path, re_path

from . import control
from .schema import e2b_openapi


def openapi_document(request: HttpRequest) -> JsonResponse:
    """GET /e2b/openapi.json: what this layer serves (public, as Sandpit's own schema)."""
    return JsonResponse(e2b_openapi())


urlpatterns = [
    path("sandboxes", control.SandboxesApi.as_view()),
    path("v2/sandboxes", control.SandboxesApi.as_view(paged=True)),
    path("sandboxes/<str:sandbox_id>", control.SandboxApi.as_view()),
    path("sandboxes/<str:sandbox_id>/timeout", control.SandboxTimeoutApi.as_view()),
    path("sandboxes/<str:sandbox_id>/connect", control.SandboxConnectApi.as_view()),
    path("sandboxes/<str:sandbox_id>/pause", control.SandboxPauseApi.as_view()),
    path("v2/sandboxes/<str:sandbox_id>/connect", control.SandboxConnectApi.as_view()),
    path("files", control.FilesApi.as_view()),
    path("health", control.HealthApi.as_view()),
    path("openapi.json", openapi_document),
    re_path(r"^.*$", control.NotSupportedApi.as_view()),
]
