"""envd's filesystem service (filesystem.Filesystem) on Sandpit's file services.

Each RPC is one Sandpit file operation, counted once by its service; watchers are Sandpit
file watchers (counted once when they start), streamed (WatchDir, the async SDK) or polled
(CreateWatcher / GetWatcherEvents / RemoveWatcher, the sync SDK). A polled watcher lives
in the sandbox's agent where the provider runs one (its id is the agent's, its read
position in the cache), so any web process answers its polls; a cloud provider's stays
in the web process that created it (`_polled`).
"""

from __future__ import annotations

import asyncio
import secrets
import stat as stat_module
from collections.abc import AsyncIterator
from typing import Any, Literal

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from e2b.envd.filesystem import filesystem_pb as pb
from e2b.envd.filesystem.filesystem_connect import Filesystem
from protobuf import Oneof
from protobuf.wkt import Timestamp

from sandboxes.file_services import (
    sandbox_file_list,
    sandbox_file_move,
    sandbox_file_remove,
    sandbox_file_stat,
    sandbox_mkdir,
)
from sandboxes.providers.base import FileEntry
from sandboxes.streaming import sandbox_watch_open_polled, sandbox_watch_start, sandbox_watch_stop
from sandboxes.watchers import FileWatcher, WatchSpec, file_event_data

from . import translate
from .rpc import call, envd_caller, guarded, within_deadline
from .services import e2b_watch_events, e2b_watch_remember

_TYPES = {"file": pb.FileType.FILE, "dir": pb.FileType.DIRECTORY, "symlink": pb.FileType.SYMLINK}
_EVENTS = {
    "created": pb.EventType.CREATE,
    "modified": pb.EventType.WRITE,
    "deleted": pb.EventType.REMOVE,
    "moved": pb.EventType.RENAME,
}
MAX_BUFFERED_EVENTS = 10_000
"""A polled watcher keeps at most this many events between two polls (oldest dropped)."""


def _entry(entry: FileEntry) -> pb.EntryInfo:
    mode = 0o755 if entry.type == "dir" else 0o644
    return pb.EntryInfo(
        name=entry.name,
        type=_TYPES.get(entry.type, pb.FileType.UNSPECIFIED),
        path=translate.e2b_path(entry.path),
        size=entry.size,
        mode=mode,
        permissions=stat_module.filemode(mode)[1:],
        owner="user",
        group="user",
        modified_time=Timestamp.from_seconds(int(entry.mtime)),
        is_symlink=entry.type == "symlink",
    )


def _relative(path: str) -> str:
    """A provider path relative to the workspace (what watch specs take)."""
    mapped = translate.sandbox_path(path)
    if mapped == translate.WORKSPACE:
        return "."
    return mapped.removeprefix(translate.WORKSPACE + "/")


def _events(message: dict[str, Any], watched: str) -> list[pb.FilesystemEvent]:
    """A watcher's batch as E2B events, named relative to the watched directory."""
    base = "" if watched in ("", ".") else watched.rstrip("/") + "/"
    found = []
    for event in message.get("events", []):
        path = str(event["path"])
        found.append(
            pb.FilesystemEvent(
                name=path.removeprefix(base), type=_EVENTS.get(event["type"], pb.EventType.WRITE)
            )
        )
    return found


class PolledWatcher:
    """A watcher whose events wait for GetWatcherEvents."""

    def __init__(self, sandbox_id: str, watched: str) -> None:
        self.sandbox_id = sandbox_id
        self.watched = watched
        self.events: list[pb.FilesystemEvent] = []
        self.watcher: FileWatcher | None = None

    def deliver(self, message: dict[str, Any]) -> None:
        if message.get("type") == "files":
            self.events.extend(_events(message, self.watched))
            del self.events[:-MAX_BUFFERED_EVENTS]


_polled: dict[str, PolledWatcher] = {}


def _polled_get(sandbox_id: str, watcher_id: str) -> PolledWatcher:
    watcher = _polled.get(watcher_id)
    if watcher is None or watcher.sandbox_id != sandbox_id:
        raise ConnectError(Code.NOT_FOUND, f"watcher {watcher_id} not found")
    return watcher


def _spec(path: str, recursive: bool) -> WatchSpec:
    # A short debounce: the SDK expects events about as they happen.
    return WatchSpec(path=_relative(path), recursive=recursive, debounce_ms=50)


class FilesystemService(Filesystem):
    """filesystem.Filesystem for the SDK's files module."""

    async def stat(self, request: pb.StatRequest, ctx: RequestContext[Any, Any]) -> pb.StatResponse:
        caller, sandbox = await envd_caller(ctx)
        entry = await call(
            sandbox_file_stat,
            caller=caller,
            sandbox=sandbox,
            path=translate.sandbox_path(request.path),
        )
        return pb.StatResponse(entry=_entry(entry))

    async def make_dir(
        self, request: pb.MakeDirRequest, ctx: RequestContext[Any, Any]
    ) -> pb.MakeDirResponse:
        """Counted once ('files.mkdir'); the SDK's 'already exists' answer comes from a stat
        that is a step of it."""
        caller, sandbox = await envd_caller(ctx)
        path = translate.sandbox_path(request.path)
        try:
            await call(sandbox_file_stat, caller=caller.unbilled(), sandbox=sandbox, path=path)
        except ConnectError as exc:
            if exc.code != Code.NOT_FOUND:
                raise
        else:
            raise ConnectError(Code.ALREADY_EXISTS, f"directory {request.path} already exists")
        entry = await call(sandbox_mkdir, caller=caller, sandbox=sandbox, path=path)
        return pb.MakeDirResponse(entry=_entry(entry))

    async def move(self, request: pb.MoveRequest, ctx: RequestContext[Any, Any]) -> pb.MoveResponse:
        caller, sandbox = await envd_caller(ctx)
        entry = await call(
            sandbox_file_move,
            caller=caller,
            sandbox=sandbox,
            src=translate.sandbox_path(request.source),
            dst=translate.sandbox_path(request.destination),
        )
        return pb.MoveResponse(entry=_entry(entry))

    async def list_dir(
        self, request: pb.ListDirRequest, ctx: RequestContext[Any, Any]
    ) -> pb.ListDirResponse:
        caller, sandbox = await envd_caller(ctx)
        depth = max(1, int(request.depth or 1))
        base = _relative(request.path)
        entries = await call(
            sandbox_file_list,
            caller=caller,
            sandbox=sandbox,
            path=translate.sandbox_path(request.path),
            recursive=depth > 1,
        )
        prefix = "" if base == "." else base.rstrip("/") + "/"
        kept = [e for e in entries if e.path.removeprefix(prefix).count("/") < depth]
        return pb.ListDirResponse(entries=[_entry(e) for e in kept])

    async def remove(
        self, request: pb.RemoveRequest, ctx: RequestContext[Any, Any]
    ) -> pb.RemoveResponse:
        caller, sandbox = await envd_caller(ctx)
        await call(
            sandbox_file_remove,
            caller=caller,
            sandbox=sandbox,
            path=translate.sandbox_path(request.path),
            recursive=True,
        )
        return pb.RemoveResponse()

    async def watch_dir(
        self, request: pb.WatchDirRequest, ctx: RequestContext[Any, Any]
    ) -> AsyncIterator[pb.WatchDirResponse]:
        """A streamed watch (counted once, 'watch.create'); it ends with the stream, or
        at the client's deadline."""
        async for response in within_deadline(ctx, self._watch(request, ctx)):
            yield response

    async def _watch(
        self, request: pb.WatchDirRequest, ctx: RequestContext[Any, Any]
    ) -> AsyncIterator[pb.WatchDirResponse]:
        caller, sandbox = await envd_caller(ctx)
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        spec = _spec(request.path, request.recursive)
        watcher = await guarded(
            sandbox_watch_start(
                caller=caller,
                sandbox=sandbox,
                watcher_id=lambda: "w" + secrets.token_hex(6),
                spec=spec,
                deliver=queue.put_nowait,
            )
        )
        try:
            start: Oneof[Literal["start"], pb.WatchDirResponse.StartEvent]
            start = Oneof("start", pb.WatchDirResponse.StartEvent())
            yield pb.WatchDirResponse(event=start)
            while True:
                message = await queue.get()
                if message.get("type") != "files":
                    return
                for event in _events(message, spec.path):
                    changed: Oneof[Literal["filesystem"], pb.FilesystemEvent]
                    changed = Oneof("filesystem", event)
                    yield pb.WatchDirResponse(event=changed)
        finally:
            watcher.close()

    async def create_watcher(
        self, request: pb.CreateWatcherRequest, ctx: RequestContext[Any, Any]
    ) -> pb.CreateWatcherResponse:
        """A polled watch (counted once, 'watch.create')."""
        caller, sandbox = await envd_caller(ctx)
        spec = _spec(request.path, request.recursive)
        opened = await call(sandbox_watch_open_polled, caller=caller, sandbox=sandbox, spec=spec)
        if opened is not None:  # held by the agent, polled through any web process
            session_id, offset = opened
            await call(e2b_watch_remember, session_id=session_id, path=spec.path, offset=offset)
            return pb.CreateWatcherResponse(watcher_id=session_id)
        polled = PolledWatcher(sandbox.id, spec.path)
        watcher_id = "w" + secrets.token_hex(8)
        polled.watcher = await guarded(
            sandbox_watch_start(
                caller=caller,
                sandbox=sandbox,
                watcher_id=lambda: watcher_id,
                spec=spec,
                deliver=polled.deliver,
            )
        )
        _polled[watcher_id] = polled
        return pb.CreateWatcherResponse(watcher_id=watcher_id)

    async def get_watcher_events(
        self, request: pb.GetWatcherEventsRequest, ctx: RequestContext[Any, Any]
    ) -> pb.GetWatcherEventsResponse:
        """Events since the last poll (not counted: reads what the watcher collected)."""
        caller, sandbox = await envd_caller(ctx)
        if request.watcher_id.startswith("watch_"):
            found, watched = await call(
                e2b_watch_events, caller=caller, sandbox=sandbox, session_id=request.watcher_id
            )
            message = {"events": [file_event_data(e) for e in found]}
            return pb.GetWatcherEventsResponse(events=_events(message, watched))
        polled = _polled_get(sandbox.id, request.watcher_id)
        events, polled.events = polled.events, []
        return pb.GetWatcherEventsResponse(events=events)

    async def remove_watcher(
        self, request: pb.RemoveWatcherRequest, ctx: RequestContext[Any, Any]
    ) -> pb.RemoveWatcherResponse:
        """Stop a polled watch (not counted: stopping)."""
        caller, sandbox = await envd_caller(ctx)
        if request.watcher_id.startswith("watch_"):
            await call(
                sandbox_watch_stop, caller=caller, sandbox=sandbox, session_id=request.watcher_id
            )
            return pb.RemoveWatcherResponse()
        polled = _polled_get(sandbox.id, request.watcher_id)
        _polled.pop(request.watcher_id, None)
        if polled.watcher is not None:
            polled.watcher.close()
        return pb.RemoveWatcherResponse()
