"""The E2B layer's ASGI front: envd's Connect RPC services, and previews by host name.

Connect RPC (/e2b/process.Process/*, /e2b/filesystem.Filesystem/*) is served by the
`connectrpc` package's ASGI applications, built from the endpoint tables the installed `e2b`
package generated from envd's protobuf files, with Sandpit's own service implementations
(e2bcompat.processes, e2bcompat.filesystem). Everything else goes on to Sandpit's HTTP app.

`sandbox.get_host(port)` is `<port>-<sandbox id>.<SANDPIT_E2B_DOMAIN>`: a request whose Host
has that form is handed to Sandpit's preview proxy as /sandboxes/<id>/ports/<port>/...
(preview_path_for_host), with its auth and metering; any host-based preview can reuse it.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from django.conf import settings
from e2b.envd.filesystem.filesystem_connect import FilesystemASGIApplication
from e2b.envd.process.process_connect import ProcessASGIApplication

from sandboxes.terminals import terminal_manager

from .filesystem import FilesystemService
from .processes import ProcessService

PREFIX = "/e2b"
_HOST = re.compile(r"^(?P<port>[0-9]{1,5})-(?P<sandbox_id>[A-Za-z0-9_-]{1,40})\.(?P<domain>.+)$")


def preview_path_for_host(host: str, path: str, domain: str) -> str | None:
    """The preview path a `<port>-<sandbox id>.<domain>` host stands for, else None."""
    if not domain:
        return None
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    match = _HOST.match(name.lower())
    if match is None or match["domain"] != domain.lower().rsplit(":", 1)[0]:
        return None
    return f"/sandboxes/{match['sandbox_id']}/ports/{int(match['port'])}{path}"


def _host(scope: dict[str, Any]) -> str:
    for name, value in scope.get("headers") or ():
        if name == b"host":
            return str(value.decode("latin-1"))
    return ""


class E2BRouter:
    """Outermost HTTP app: Connect RPC and host-named previews here, the rest to `app`."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.rpc = {
            f"{PREFIX}/process.Process/": ProcessASGIApplication(ProcessService()),
            f"{PREFIX}/filesystem.Filesystem/": FilesystemASGIApplication(FilesystemService()),
        }

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            if path.startswith(PREFIX + "/"):
                for prefix, rpc_app in self.rpc.items():
                    if path.startswith(prefix):
                        # PTYs are Sandpit terminals: they read on the serving loop.
                        loop = asyncio.get_running_loop()
                        if terminal_manager.loop is not loop:
                            terminal_manager.bind_loop(loop)
                        await rpc_app({**scope, "path": path.removeprefix(PREFIX)}, receive, send)
                        return
            preview = preview_path_for_host(_host(scope), path, settings.SANDPIT_E2B_DOMAIN)
            if preview is not None:
                scope = {**scope, "path": preview, "raw_path": preview.encode()}
        await self.app(scope, receive, send)
