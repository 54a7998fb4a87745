"""The HTTP side of the ASGI app: a request for a preview (by host or by path) goes to the
proxy, everything else to Django."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, cast

from channels.auth import AuthMiddlewareStack

from sandboxes.terminals import terminal_manager

from .addresses import (
    HOST_TARGET,
    PREVIEW_PATH,
    preview_host_target,
    preview_paths_enabled,
    scope_host,
)
from .headers import send_json
from .http_proxy import PreviewHttpProxy

AsgiApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


class PreviewRouter:
    """The HTTP side of the ASGI app: previews here, everything else to Django. Also tells
    the terminal manager which loop serves requests (REST-created terminals read on it)."""

    def __init__(self, django_app: Any) -> None:
        self.django_app = django_app
        # Channels types its middleware for its own scope TypedDicts; it is an ASGI app.
        self.proxy = cast(AsgiApp, AuthMiddlewareStack(PreviewHttpProxy()))
        self.host_proxy = PreviewHttpProxy()  # no session middleware: not accepted there

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        loop = asyncio.get_running_loop()
        if terminal_manager.loop is not loop:
            terminal_manager.bind_loop(loop)
        if scope["type"] == "http":
            target = preview_host_target(scope_host(scope))
            if target is False:
                await send_json(send, 404, "not_found", "No such preview host.")
                return
            if isinstance(target, tuple):
                await self.host_proxy({**scope, HOST_TARGET: target}, receive, send)
                return
            if preview_paths_enabled() and PREVIEW_PATH.match(scope["path"]):
                await self.proxy(scope, receive, send)
                return
        await self.django_app(scope, receive, send)
