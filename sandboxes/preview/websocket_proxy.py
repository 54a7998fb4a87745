"""The WebSocket side of a preview: authorize, open the port, and relay frames both ways
until either side closes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any
from urllib.parse import parse_qsl, urlencode

from channels.db import database_sync_to_async
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, WebSocketException

from common.errors import PaymentRequired
from sandboxes.realtime.auth import WS_PAYMENT_REQUIRED, RealtimeDenied
from sandboxes.streaming import ProviderError, sandbox_port_websocket_opened

from .access import authorize, open_port
from .addresses import HOST_TARGET, PREVIEW_PATH, preview_paths_enabled

logger = logging.getLogger(__name__)


class PreviewWebSocketProxy:
    """ASGI app for websocket scopes under /sandboxes/<id>/ports/<port>/ (behind the Origin
    validator and the session middleware of playground/asgi.py), or on a preview host
    (HOST_TARGET in the scope; no session there, and the Origin must be the host's own)."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        target = scope.get(HOST_TARGET)
        if target is not None:
            sandbox_id, port = target
            rest = scope["path"] or "/"
            scope = {k: v for k, v in scope.items() if k not in ("user", "session")}
        else:
            match = PREVIEW_PATH.match(scope["path"])
            if match is None or not preview_paths_enabled():
                await send({"type": "websocket.close", "code": 4404})
                return
            sandbox_id, port = match["sandbox_id"], int(match["port"])
            rest = match["rest"] or "/"
        message = await receive()
        if message["type"] != "websocket.connect":
            return
        try:
            caller, sandbox = await authorize(scope, sandbox_id)
            upstream = await open_port(caller, sandbox, port, None)
        except RealtimeDenied as denied:
            await send({"type": "websocket.accept"})
            await send({"type": "websocket.close", "code": denied.close_code})
            return
        except ProviderError:
            await send({"type": "websocket.close", "code": 1011})
            return
        except PaymentRequired:  # the plan changed since this socket was admitted
            await send({"type": "websocket.accept"})
            await send({"type": "websocket.close", "code": WS_PAYMENT_REQUIRED})
            return
        query = [
            (k, v)
            for k, v in parse_qsl(
                scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True
            )
            if k != "token"
        ]
        uri = f"ws://localhost:{port}{rest}" + ("?" + urlencode(query) if query else "")
        try:
            async with connect(
                uri,
                sock=upstream.sock,
                subprotocols=scope.get("subprotocols") or None,
                open_timeout=10,
                max_size=None,
                compression=None,
            ) as ws:
                await send({"type": "websocket.accept", "subprotocol": ws.subprotocol})
                asyncio.ensure_future(
                    database_sync_to_async(sandbox_port_websocket_opened)(caller=caller)
                )

                async def downstream() -> None:
                    async for data in ws:
                        if isinstance(data, bytes):
                            await send({"type": "websocket.send", "bytes": data})
                        else:
                            await send({"type": "websocket.send", "text": data})

                pump = asyncio.ensure_future(downstream())
                try:
                    while True:
                        get = asyncio.ensure_future(receive())
                        done, _ = await asyncio.wait(
                            {get, pump}, return_when=asyncio.FIRST_COMPLETED
                        )
                        if pump in done:
                            get.cancel()
                            await send({"type": "websocket.close", "code": ws.close_code or 1000})
                            return
                        incoming = get.result()
                        if incoming["type"] == "websocket.disconnect":
                            return
                        if incoming.get("bytes") is not None:
                            await ws.send(incoming["bytes"])
                        elif incoming.get("text") is not None:
                            await ws.send(incoming["text"])
                finally:
                    pump.cancel()
        except (OSError, WebSocketException, ConnectionClosed, TimeoutError):
            logger.info("preview websocket ended", exc_info=True)
            with contextlib.suppress(Exception):  # the client may be gone already
                await send({"type": "websocket.close", "code": 1011})
        finally:
            await upstream.close()
