"""WebSocket routes and the HTTP wrapper that serves port previews (used by playground/asgi.py)."""

from __future__ import annotations

from typing import Any

from django.urls import path, re_path

from .preview.router import PreviewRouter
from .preview.websocket_proxy import PreviewWebSocketProxy
from .realtime.events import SandboxEventsConsumer
from .realtime.exec import ExecConsumer
from .realtime.terminal import TerminalConsumer

# Channels' URLRouter routes ASGI apps with Django's path(); django-stubs type the second
# argument as a view, hence the arg-type ignores.
websocket_urlpatterns: list[Any] = [
    path(
        "ws/sandboxes/<str:sandbox_id>/terminals/<str:terminal_id>",
        TerminalConsumer.as_asgi(),  # type: ignore[arg-type]
    ),
    path("ws/sandboxes/<str:sandbox_id>/events", SandboxEventsConsumer.as_asgi()),  # type: ignore[arg-type]
    path("ws/sandboxes/<str:sandbox_id>/exec", ExecConsumer.as_asgi()),  # type: ignore[arg-type]
    re_path(r"^sandboxes/[A-Za-z0-9_-]+/ports/[0-9]+(/.*)?$", PreviewWebSocketProxy()),  # type: ignore[arg-type]
]


def http_app(django_app: Any) -> Any:
    """Django, with /sandboxes/<id>/ports/<port>/... proxied to the sandbox."""
    return PreviewRouter(django_app)
