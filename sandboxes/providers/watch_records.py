"""The records of the agent's file watch (``inotifywait -m`` lines: `<EVENTS> <full path>`)
as FileEvents. Read by both ends that receive a watch: the docker provider's own watch and
the agent sessions' (sandboxes/agent_sessions.py)."""

from __future__ import annotations

from sandboxes.providers.base import FileEvent

WORKSPACE = "/workspace"


def file_events(raw: list[tuple[str, str]]) -> list[FileEvent]:
    """inotifywait records -> FileEvents, pairing moves and dropping duplicates."""
    events: list[FileEvent] = []
    seen: set[tuple[str, str]] = set()
    moved_from: tuple[str, bool] | None = None

    def rel(full: str) -> str:
        return full[len(WORKSPACE) + 1 :] if full.startswith(WORKSPACE + "/") else ""

    def add(event: FileEvent) -> None:
        key = (event.type, event.path)
        if event.type in ("created", "modified") and key in seen:
            return
        seen.add(key)
        events.append(event)

    for kinds, full in raw:
        flags = set(kinds.split(","))
        is_dir = "ISDIR" in flags
        path = rel(full)
        if moved_from is not None and "MOVED_TO" not in flags:
            add(FileEvent("deleted", moved_from[0], is_dir=moved_from[1]))
            moved_from = None
        if "MOVED_FROM" in flags:
            moved_from = (path, is_dir)
        elif "MOVED_TO" in flags:
            if moved_from is not None:
                add(FileEvent("moved", path, is_dir=is_dir, old_path=moved_from[0]))
                moved_from = None
            else:
                add(FileEvent("created", path, is_dir=is_dir))
        elif "CREATE" in flags:
            add(FileEvent("created", path, is_dir=is_dir))
        elif "DELETE" in flags:
            add(FileEvent("deleted", path, is_dir=is_dir))
        elif "MODIFY" in flags or "CLOSE_WRITE" in flags:
            if not is_dir:
                add(FileEvent("modified", path))
    if moved_from is not None:
        add(FileEvent("deleted", moved_from[0], is_dir=moved_from[1]))
    return events
