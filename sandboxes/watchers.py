"""Signals for the events socket: file watchers and port/process pollers.

Both deliver to callbacks on the event loop of the process holding the socket, so events
reach the browser without a channel-layer hop. A FileWatcher belongs to one socket (its
path, ignore globs and debounce are that client's). A SandboxPoller is shared by every
socket of this process subscribed to one sandbox, and runs only while one is.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async

from .preview.addresses import preview_url
from .providers.base import (
    Capability,
    FileEvent,
    ProviderError,
    SandboxGone,
    SandboxProvider,
)

logger = logging.getLogger(__name__)

PORT_POLL_INTERVAL_S = 0.75
"""How often open ports (and started processes) are polled while someone listens."""
MAX_DEBOUNCE_MS = 5000
MAX_WATCHERS_PER_SOCKET = 16

Deliver = Callable[[dict[str, Any]], None]


# --- file watching ------------------------------------------------------------------------------


def path_ignored(path: str, patterns: Sequence[str]) -> bool:
    """gitignore-like matching on a workspace-relative path.

    A pattern without '/' matches any path segment ('node_modules', '*.pyc'); 'dir/**'
    matches dir and everything below it; other patterns match the whole path (fnmatch).
    """
    if not patterns:
        return False
    segments = path.split("/")
    for raw in patterns:
        pattern = raw.strip().strip("/")
        if not pattern:
            continue
        if "/" not in pattern:
            if any(fnmatch.fnmatchcase(segment, pattern) for segment in segments):
                return True
        elif pattern.endswith("/**"):
            base = pattern[:-3]
            if fnmatch.fnmatchcase(path, base) or fnmatch.fnmatchcase(path, base + "/*"):
                return True
        elif fnmatch.fnmatchcase(path, pattern):
            return True
    return False


def coalesce_events(events: Iterable[FileEvent]) -> list[FileEvent]:
    """Fold a debounce window's events to at most one per path, in first-seen order:
    created+modified → created, created+deleted → nothing, modified+deleted → deleted."""
    folded: dict[str, FileEvent | None] = {}
    for event in events:
        if event.type == "moved":
            folded.pop(event.path, None)
            folded[event.path] = event
            continue
        previous = folded.get(event.path)
        if previous is None:
            folded[event.path] = event
        elif previous.type == "created" and event.type == "modified":
            continue
        elif previous.type == "created" and event.type == "deleted":
            folded[event.path] = None
        elif previous.type == "deleted" and event.type == "created":
            folded[event.path] = FileEvent("modified", event.path, event.is_dir)
        else:
            folded[event.path] = event
    return [event for event in folded.values() if event is not None]


def file_event_data(event: FileEvent) -> dict[str, Any]:
    data: dict[str, Any] = {"type": event.type, "path": event.path, "is_dir": event.is_dir}
    if event.old_path is not None:
        data["old_path"] = event.old_path
    return data


@dataclass(frozen=True)
class WatchSpec:
    """What a client asked to watch."""

    path: str = "."
    """Relative to the workspace."""
    recursive: bool = True
    ignore: tuple[str, ...] = ()
    """Glob patterns (see path_ignored)."""
    debounce_ms: int = 100
    """Events are collected this long after the first one, then sent as one batch."""


class FileWatcher:
    """One provider watch, iterated in a thread, debounced and filtered on the loop."""

    def __init__(
        self,
        *,
        watcher_id: str,
        provider: SandboxProvider,
        provider_id: str,
        spec: WatchSpec,
        deliver: Deliver,
        opener: Callable[[], Iterator[list[FileEvent]]] | None = None,
    ) -> None:
        self.id = watcher_id
        self.spec = spec
        self._provider = provider
        self._provider_id = provider_id
        self._deliver = deliver
        self._opener = opener
        """Opens the batches instead of provider.watch (a watch held by the agent, whose
        iterator has `session_id` and `offset`: sandboxes/agent_sessions.AgentWatch)."""
        self._iterator: Iterator[list[FileEvent]] | None = None
        self._queue: asyncio.Queue[tuple[list[FileEvent], int | None] | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    async def start(self) -> None:
        """Establish the watch (raises the provider's errors); events flow after this."""
        if self._opener is not None:
            self._iterator = await sync_to_async(self._opener, thread_sensitive=False)()
        else:
            self._iterator = await sync_to_async(self._provider.watch, thread_sensitive=False)(
                self._provider_id, self.spec.path, self.spec.recursive
            )
        loop = asyncio.get_running_loop()
        thread = threading.Thread(
            target=self._pump, args=(loop,), name=f"watch-{self.id}", daemon=True
        )
        thread.start()
        self._task = asyncio.ensure_future(self._debounce())

    def _pump(self, loop: asyncio.AbstractEventLoop) -> None:
        assert self._iterator is not None
        try:
            for batch in self._iterator:
                if self._closed:
                    break
                offset = getattr(self._iterator, "offset", None)
                loop.call_soon_threadsafe(self._queue.put_nowait, (batch, offset))
        except (ProviderError, OSError, ValueError):
            logger.info("file watch ended with an error", exc_info=True)
        finally:
            if not loop.is_closed():
                try:
                    loop.call_soon_threadsafe(self._queue.put_nowait, None)
                except RuntimeError:
                    pass

    async def _debounce(self) -> None:
        loop = asyncio.get_running_loop()
        window_s = self.spec.debounce_ms / 1000
        ended = False
        while not ended:
            first = await self._queue.get()
            if first is None:
                break
            pending = list(first[0])
            offset = first[1]
            deadline = loop.time() + window_s
            while (remaining := deadline - loop.time()) > 0:
                try:
                    more = await asyncio.wait_for(self._queue.get(), remaining)
                except TimeoutError:
                    break
                if more is None:
                    ended = True
                    break
                pending.extend(more[0])
                offset = more[1]
            events = [
                event
                for event in coalesce_events(pending)
                if not (
                    path_ignored(event.path, self.spec.ignore)
                    and (event.old_path is None or path_ignored(event.old_path, self.spec.ignore))
                )
            ]
            if events:
                message: dict[str, Any] = {
                    "type": "files",
                    "watcher": self.id,
                    "events": [file_event_data(e) for e in events],
                }
                if offset is not None:  # where a resumed watch picks up (after these)
                    message["offset"] = offset
                self._deliver(message)
        if not self._closed:
            self._deliver({"type": "watch_ended", "watcher": self.id})

    @property
    def session_id(self) -> str | None:
        """The agent's id of this watch, when it lives there (resumable)."""
        return getattr(self._iterator, "session_id", None)

    def close(self) -> None:
        """Stop watching. Safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        if self._task is not None:
            self._task.cancel()
        iterator = self._iterator
        if iterator is not None and hasattr(iterator, "close"):
            try:
                iterator.close()
            except ValueError:
                # A generator blocked in next() in the pump thread cannot be closed from
                # here; it ends at its next event or when the sandbox goes.
                logger.debug("watch iterator busy; it will end with its next event")


# --- ports and processes --------------------------------------------------------------------------


def port_url(sandbox_id: str, port: int) -> str:
    """Where a viewer opens the port (its own host when a preview domain is configured)."""
    return preview_url(sandbox_id, port)


class SandboxPoller:
    """Polls open ports (and started processes) of one sandbox and tells subscribers what
    changed: port_open / port_closed / process_exit."""

    def __init__(self, sandbox_id: str, provider: SandboxProvider, provider_id: str) -> None:
        self.sandbox_id = sandbox_id
        self._provider = provider
        self._provider_id = provider_id
        self.ports: dict[int, str] = {}
        self._exited: set[int] = set()
        self.subscribers: dict[Deliver, bool] = {}
        """callback → whether it receives port signals (needs the 'ports' scope/plan)."""
        self._task: asyncio.Task[None] | None = None
        self._primed = False

    def subscribe(self, deliver: Deliver, *, ports: bool) -> None:
        self.subscribers[deliver] = ports
        if ports and self._primed:
            for port, address in sorted(self.ports.items()):
                deliver(self._port_event("port_open", port, address))
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    def unsubscribe(self, deliver: Deliver) -> bool:
        """Returns True when nobody is left (the poller stopped)."""
        self.subscribers.pop(deliver, None)
        if not self.subscribers and self._task is not None:
            self._task.cancel()
            self._task = None
        return not self.subscribers

    def _port_event(self, kind: str, port: int, address: str) -> dict[str, Any]:
        return {
            "type": kind,
            "port": port,
            "address": address,
            "url": port_url(self.sandbox_id, port),
        }

    def _emit(self, event: dict[str, Any], *, ports_only: bool) -> None:
        for deliver, wants_ports in tuple(self.subscribers.items()):
            if wants_ports or not ports_only:
                deliver(event)

    async def _run(self) -> None:
        poll = sync_to_async(self._poll_once, thread_sensitive=False)
        while True:
            try:
                ports, processes = await poll()
            except SandboxGone:
                self._emit({"type": "status", "state": "gone"}, ports_only=False)
                return
            except ProviderError:
                logger.info("port poll failed", exc_info=True)
                await asyncio.sleep(PORT_POLL_INTERVAL_S * 4)
                continue
            for port in sorted(set(self.ports) - set(ports)):
                self._emit(self._port_event("port_closed", port, self.ports[port]), ports_only=True)
            for port in sorted(set(ports) - set(self.ports)):
                self._emit(self._port_event("port_open", port, ports[port]), ports_only=True)
            self.ports = ports
            if processes is not None:
                for pid, (command, running, code) in sorted(processes.items()):
                    if running or pid in self._exited:
                        continue
                    self._exited.add(pid)
                    if self._primed:  # exits before we started listening are history
                        self._emit(
                            {
                                "type": "process_exit",
                                "pid": pid,
                                "command": command,
                                "exit_code": code,
                            },
                            ports_only=False,
                        )
            self._primed = True
            await asyncio.sleep(PORT_POLL_INTERVAL_S)

    def _poll_once(
        self,
    ) -> tuple[dict[int, str], dict[int, tuple[str, bool, int | None]] | None]:
        ports: dict[int, str] = {}
        if Capability.PORTS in self._provider.capabilities:
            for open_port in self._provider.open_ports(self._provider_id):
                ports.setdefault(open_port.port, open_port.address)
        processes = None
        if Capability.PROCESSES in self._provider.capabilities:
            processes = {
                p.pid: (p.command, p.running, p.exit_code)
                for p in self._provider.list_processes(self._provider_id)
            }
        return ports, processes


class SandboxPollers:
    """This process's pollers, one per sandbox with at least one subscriber."""

    def __init__(self) -> None:
        self._pollers: dict[str, SandboxPoller] = {}

    def subscribe(
        self,
        *,
        sandbox_id: str,
        provider: SandboxProvider,
        provider_id: str,
        deliver: Deliver,
        ports: bool,
    ) -> None:
        poller = self._pollers.get(sandbox_id)
        if poller is None:
            poller = self._pollers[sandbox_id] = SandboxPoller(sandbox_id, provider, provider_id)
        poller.subscribe(deliver, ports=ports)

    def unsubscribe(self, sandbox_id: str, deliver: Deliver) -> None:
        poller = self._pollers.get(sandbox_id)
        if poller is not None and poller.unsubscribe(deliver):
            del self._pollers[sandbox_id]


sandbox_pollers = SandboxPollers()
