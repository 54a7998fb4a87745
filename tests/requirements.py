"""When a real part of the test environment is missing: skip locally, fail under CI.

CI (`CI=true`) runs `make test`, which installs and starts every part (PostgreSQL, Redis,
bubblewrap, slirp4netns, Docker, Chromium, the cloud SDK extras), so a missing one there is a
broken set-up, not a reason to pass quietly.
"""

from __future__ import annotations

import importlib
import os
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
