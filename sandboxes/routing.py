"""WebSocket routes and the HTTP wrapper that serves port previews (used by playground/asgi.py)."""

from __future__ import annotations

from typing import Any

from django.urls import path, re_path

from .preview import PreviewRouter, PreviewWebSocketProxy
from .realtime.events import SandboxEventsConsumer
from .realtime.exec import ExecConsumer
from .realtime.terminal import TerminalConsumer

websocket_urlpatterns: list[Any] = [
    path(
        "ws/sandboxes/<str:sandbox_id>/terminals/<str:terminal_id>",
        TerminalConsumer.as_asgi(),
    ),
    path("ws/sandboxes/<str:sandbox_id>/events", SandboxEventsConsumer.as_asgi()),
    path("ws/sandboxes/<str:sandbox_id>/exec", ExecConsumer.as_asgi()),
    re_path(r"^sandboxes/[A-Za-z0-9_-]+/ports/[0-9]+(/.*)?$", PreviewWebSocketProxy()),
]


def http_app(django_app: Any) -> Any:
    """Django, with /sandboxes/<id>/ports/<port>/... proxied to the sandbox."""
    return PreviewRouter(django_app)
