"""ASGI entry point: HTTP through Django, WebSockets through Channels with Origin checks."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "playground.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import OriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402

from sandboxes.routing import http_app, websocket_urlpatterns  # noqa: E402


class BrowserOriginValidator(OriginValidator):
    """Refuse WebSockets whose Origin is not one of ALLOWED_HOSTS, so a foreign page cannot
    open a socket with the user's cookies. Browsers always send Origin on a WebSocket
    handshake; programs (API keys, sandbox tokens) may omit it, and then they authenticate
    with credentials a foreign page does not have."""

    def valid_origin(self, parsed_origin):  # type: ignore[no-untyped-def]
        if parsed_origin is None:
            return True
        return super().valid_origin(parsed_origin)


def origin_checked(app):  # type: ignore[no-untyped-def]
    return BrowserOriginValidator(app, list(settings.ALLOWED_HOSTS))


application = ProtocolTypeRouter(
    {
        "http": http_app(django_asgi_app),
        "websocket": origin_checked(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
