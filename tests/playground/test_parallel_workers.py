"""The suite runs on several pytest-xdist workers (scripts/test.sh): each must be an
installation of its own, or one worker's reconciler, pool or billing keys would reach the
sandboxes and counters of another (tests/conftest.py's pytest_configure)."""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings

from tests.docker_support import TEST_INSTALLATION


def test_a_worker_has_its_own_installations_and_jail_root() -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    installation = settings.SANDPIT_INSTALLATION
    root = Path(settings.SANDPIT_LOCAL_ROOT)
    # Servers the tests start read the environment: it must name the same.
    assert os.environ.get("SANDPIT_INSTALLATION", "default") == installation
    if worker is None:  # one process: nothing to keep apart
        return
    assert installation.endswith(f"-{worker}")
    # The installation the docker tests' own providers use.
    assert TEST_INSTALLATION.endswith(f"-{worker}")
    assert root.name.endswith(f"-{worker}")
    assert root.is_dir() and root.stat().st_mode & 0o111 == 0o111
    assert os.environ["SANDPIT_LOCAL_ROOT"] == str(root)
