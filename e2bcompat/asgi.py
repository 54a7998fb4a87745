"""The E2B layer's ASGI front: envd's Connect RPC services, and previews by host name.

Connect RPC (/e2b/process.Process/*, /e2b/filesystem.Filesystem/*) is served by the
`connectrpc` package's ASGI applications, built from the endpoint tables the installed `e2b`
package generated from envd's protobuf files, with Sandpit's own service implementations
(e2bcompat.processes, e2bcompat.filesystem). Everything else goes on to Sandpit's HTTP app.

`sandbox.get_host(port)` is `<port>-<sandbox id>.<SANDPIT_E2B_DOMAIN>`: Sandpit's preview
router (sandboxes/preview/, which this app wraps) serves that domain as it serves
SANDPIT_PREVIEW_DOMAIN, each preview on its own host, with the proxy's auth and metering.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from e2b.envd.filesystem.filesystem_connect import FilesystemASGIApplication
from e2b.envd.process.process_connect import ProcessASGIApplication

from sandboxes.preview.addresses import preview_host_target, scope_host
from sandboxes.preview.router import AsgiApp
from sandboxes.terminals import terminal_manager

from .filesystem import FilesystemService
from .processes import ProcessService
from .rpc import request_codecs

PREFIX = "/e2b"


class E2BRouter:
    """Outermost HTTP app: Connect RPC here, the rest (previews included) to `app`."""

    def __init__(self, app: Any) -> None:
        self.app = app
        # connectrpc types a scope with asgiref's TypedDicts; ASGI apps here take plain dicts.
        self.rpc: dict[str, AsgiApp] = {
            f"{PREFIX}/process.Process/": cast(
                AsgiApp, ProcessASGIApplication(ProcessService(), codecs=request_codecs())
            ),
            f"{PREFIX}/filesystem.Filesystem/": cast(
                AsgiApp, FilesystemASGIApplication(FilesystemService(), codecs=request_codecs())
            ),
        }

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            # On a preview host every path is the previewed app's.
            if path.startswith(PREFIX + "/") and preview_host_target(scope_host(scope)) is None:
                for prefix, rpc_app in self.rpc.items():
                    if path.startswith(prefix):
                        # PTYs are Sandpit terminals: they read on the serving loop.
                        loop = asyncio.get_running_loop()
                        if terminal_manager.loop is not loop:
                            terminal_manager.bind_loop(loop)
                        await rpc_app({**scope, "path": path.removeprefix(PREFIX)}, receive, send)
                        return
        await self.app(scope, receive, send)
