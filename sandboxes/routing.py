"""WebSocket routes and the HTTP wrapper that serves port previews."""

from __future__ import annotations

websocket_urlpatterns: list = []


def http_app(django_app):  # type: ignore[no-untyped-def]
    return django_app
