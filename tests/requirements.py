"""When a real part of the test environment is missing: skip locally, fail under CI.

CI (`CI=true`) runs `make test`, which installs and starts every part (PostgreSQL, Redis,
bubblewrap, slirp4netns, Docker, Chromium, the cloud SDK extras), so a missing one there is a
broken set-up, not a reason to pass quietly.
"""

from __future__ import annotations

import importlib
import os
import tempfile
from pathlib import Path
from types import ModuleType

import pytest


def missing_part(reason: str) -> None:
    """pytest.skip(reason), or pytest.fail under CI=true. Never returns."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: make test provides this part, so this is a set-up bug)")
    pytest.skip(reason)


def require_module(name: str, why: str) -> ModuleType:
    """The imported module, or missing_part(why) when it is not installed."""
    try:
        return importlib.import_module(name)
    except ImportError:
        missing_part(why)
        raise  # missing_part never returns


JAIL_ROOTS = Path(tempfile.gettempdir()) / "sandpit-test-jails"

JAIL_ROOTS_MADE: list[Path] = []
"""The roots jail_root made in this session (tests/conftest.py removes their cgroup parents
at the end: the providers tests build are seldom closed)."""


def jail_root(name: str) -> Path:
    """A new, empty directory for a local provider's jails, passable (o+x) from /: local
    jails run as unprivileged host uids that must reach their own directories, and
    pytest's temp directories are private (0700) and re-made private by every pytest
    session that starts meanwhile."""
    JAIL_ROOTS.mkdir(exist_ok=True)
    os.chmod(JAIL_ROOTS, 0o711)  # noqa: S103 - pass, not list
    path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=JAIL_ROOTS))
    os.chmod(path, 0o711)  # noqa: S103 - pass, not list
    JAIL_ROOTS_MADE.append(path)
    return path
