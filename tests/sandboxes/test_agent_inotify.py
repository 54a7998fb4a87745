"""The agent's own file watcher (sandboxes/agent/inotify.py), run in this process on a
temporary directory: what a directory holds by the time its watch is added is reported."""

from __future__ import annotations

import os
from pathlib import Path

from sandboxes.agent.inotify import Watcher


def _records(batch: list[bytes]) -> list[tuple[str, str]]:
    out = []
    for raw in batch:
        kinds, _, path = raw.rstrip(b"\0").decode().partition(" ")
        out.append((kinds, path))
    return out


def test_what_a_new_directory_holds_before_its_watch_is_reported_created(tmp_path: Path) -> None:
    watcher = Watcher(recursive=True)
    try:
        watcher.add(str(tmp_path))
        # All of it before the watcher reads a single event: `mkdir -p d/e && echo > d/f`
        # finishing before the watcher has seen `d` (the race a busy machine loses).
        (tmp_path / "d" / "e").mkdir(parents=True)
        (tmp_path / "d" / "f.txt").write_text("hi\n")
        (tmp_path / "d" / "e" / "g.txt").write_text("deep\n")
        records = _records(watcher.read_batch())
        created = {path for kinds, path in records if kinds.startswith("CREATE")}
        assert {
            f"{tmp_path}/d",
            f"{tmp_path}/d/e",
            f"{tmp_path}/d/f.txt",
            f"{tmp_path}/d/e/g.txt",
        } <= created
        assert ("CREATE,ISDIR", f"{tmp_path}/d/e") in records
        # ...and the new directories are watched from then on.
        (tmp_path / "d" / "e" / "later.txt").write_text("x")
        later = _records(watcher.read_batch())
        assert ("CREATE", f"{tmp_path}/d/e/later.txt") in later
    finally:
        os.close(watcher.fd)


def test_the_directory_watched_at_start_reports_nothing_it_already_held(tmp_path: Path) -> None:
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "x.txt").write_text("x")
    watcher = Watcher(recursive=True)
    try:
        watcher.add(str(tmp_path))
        (tmp_path / "new.txt").write_text("n")
        records = _records(watcher.read_batch())
        assert [path for _, path in records if path.endswith("x.txt")] == []
        assert ("CREATE", f"{tmp_path}/new.txt") in records
    finally:
        os.close(watcher.fd)
