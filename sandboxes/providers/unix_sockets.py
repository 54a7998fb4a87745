"""Reaching an agent's Unix socket however deep the sandbox's directory lies."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SUN_PATH_ROOM = 100
"""sun_path holds 107 bytes with its NUL; longer paths fail with 'AF_UNIX path too long'."""


@contextmanager
def reachable_path(path: Path) -> Iterator[str]:
    """A name `connect()` takes for the socket at `path`: the path itself, or, past
    sun_path's room (a checkout or var dir deep in the filesystem), the socket's name under a
    descriptor of its directory, open while the block runs."""
    name = str(path)
    if len(name.encode()) <= SUN_PATH_ROOM:
        yield name
        return
    dir_fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{dir_fd}/{path.name}"
    finally:
        os.close(dir_fd)
