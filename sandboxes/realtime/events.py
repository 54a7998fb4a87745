"""/ws/sandboxes/<id>/events: status, ports, process exits and file watchers."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async

from common.errors import ApplicationError
from sandboxes.events import sandbox_events_group
from sandboxes.streaming import (
    ProviderError,
    sandbox_events_ports_allowed,
    sandbox_events_subscribe,
    sandbox_events_unsubscribe,
    sandbox_watch_resume,
    sandbox_watch_start,
)
from sandboxes.watchers import MAX_DEBOUNCE_MS, MAX_WATCHERS_PER_SOCKET, FileWatcher, WatchSpec

from .auth import RealtimeDenied, realtime_authorize
from .outbound import OutboundConsumer


class SandboxEventsConsumer(OutboundConsumer):
    """Subscribes to the sandbox's channel-layer group (status from any process) and to the
    local pollers (ports, processes); file watchers on request."""

    async def connect(self) -> None:
        sandbox_id = self.scope["url_route"]["kwargs"]["sandbox_id"]
        try:
            self.caller, self.sandbox = await database_sync_to_async(realtime_authorize)(
                self.scope, sandbox_id=sandbox_id, required_scope=None, feature=None
            )
        except RealtimeDenied as denied:
            await self.refuse(denied)
            return
        self.watchers: dict[str, FileWatcher] = {}
        self._watcher_seq = 0
        self._group = sandbox_events_group(self.sandbox.id)
        if self.channel_layer is not None:
            await self.channel_layer.group_add(self._group, self.channel_name)
        await self.accept()
        self.init_outbound()
        signals = ["status"]
        wants_ports = await database_sync_to_async(sandbox_events_ports_allowed)(caller=self.caller)
        self._subscribed = sandbox_events_subscribe(
            sandbox=self.sandbox, deliver=self.enqueue, ports=wants_ports
        )
        if self._subscribed:
            if wants_ports:
                signals.append("ports")
            signals.append("processes")
        if self._has_scope("files"):
            signals.append("files")
        self.enqueue(
            {
                "type": "ready",
                "sandbox": self.sandbox.id,
                "state": self.sandbox.state,
                "signals": signals,
            }
        )

    def _has_scope(self, scope: str) -> bool:
        principal = self.caller.principal
        return principal is not None and principal.has_scope(scope)

    async def sandbox_event(self, message: dict[str, Any]) -> None:
        """From the channel layer (sandbox_event_broadcast): forward as is."""
        self.enqueue(message["event"])

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if not hasattr(self, "watchers"):
            return
        message = self.parse_json(text_data or "")
        if message is None:
            return
        kind = message["type"]
        if kind == "watch":
            await self._watch(message)
        elif kind == "unwatch":
            watcher = self.watchers.pop(str(message.get("id")), None)
            if watcher is None:
                self.error("watcher_not_found", "No such watcher.", id=message.get("id"))
            else:
                watcher.close()
                self.enqueue({"type": "unwatched", "id": watcher.id})
        elif kind == "ping":
            self.enqueue({"type": "pong"})
        else:
            self.error("invalid_message", f"Unknown message type '{kind}'.")

    async def _watch(self, message: dict[str, Any]) -> None:
        request_id = message.get("request_id")
        if not self._has_scope("files"):
            self.error("scope_missing", "This token lacks the 'files' scope.", status=403)
            return
        if len(self.watchers) >= MAX_WATCHERS_PER_SOCKET:
            self.error("watcher_limit_reached", "Too many watchers on this socket.", status=429)
            return
        try:
            spec = WatchSpec(
                path=str(message.get("path") or "."),
                recursive=bool(message.get("recursive", True)),
                ignore=tuple(str(p) for p in message.get("ignore") or ())[:64],
                debounce_ms=max(0, min(int(message.get("debounce_ms", 100)), MAX_DEBOUNCE_MS)),
            )
        except (TypeError, ValueError):
            self.error("invalid_message", "watch: path, recursive, ignore[], debounce_ms.")
            return

        def watcher_id() -> str:
            self._watcher_seq += 1
            return str(message.get("id") or f"w{self._watcher_seq}")

        try:
            if message.get("resume"):  # a watch started through any web process
                watcher = await sandbox_watch_resume(
                    caller=self.caller,
                    sandbox=self.sandbox,
                    session_id=str(message["resume"]),
                    since=max(0, int(message.get("since") or 0)),
                    watcher_id=watcher_id(),
                    spec=spec,
                    deliver=self.enqueue,
                )
            else:
                watcher = await sandbox_watch_start(
                    caller=self.caller,
                    sandbox=self.sandbox,
                    watcher_id=watcher_id,
                    spec=spec,
                    deliver=self.enqueue,
                )
        except (TypeError, ValueError):
            self.error("invalid_message", "watch: 'since' is a byte offset.")
            return
        except (ApplicationError, ProviderError) as exc:
            self.error(exc.code, exc.message, status=exc.status_code, request_id=request_id)
            return
        except Exception as exc:
            self.refuse_if_database_unavailable(exc, request_id=request_id)
            return
        old = self.watchers.pop(watcher.id, None)
        if old is not None:
            old.close()
        self.watchers[watcher.id] = watcher
        watching: dict[str, Any] = {
            "type": "watching",
            "id": watcher.id,
            "path": spec.path,
            "recursive": spec.recursive,
            "request_id": request_id,
        }
        if watcher.session_id is not None:  # resumable through any web process
            watching["session"] = watcher.session_id
        self.enqueue(watching)

    async def disconnect(self, code: int) -> None:
        for watcher in getattr(self, "watchers", {}).values():
            watcher.close()
        if getattr(self, "_subscribed", False):
            sandbox_events_unsubscribe(sandbox=self.sandbox, deliver=self.enqueue)
        if self.channel_layer is not None and hasattr(self, "_group"):
            await self.channel_layer.group_discard(self._group, self.channel_name)
        self.stop_outbound()
