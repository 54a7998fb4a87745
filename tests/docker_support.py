"""Getting a working DockerProvider for tests, or a clear skip.

`docker_provider_or_skip()` starts the engine (scripts/docker-up.sh) and builds
the sandbox image (scripts/build-sandbox-image.sh) once per test session, and its
providers use that image by its content tag: `sandpit-sandbox:latest` is whatever
checkout on this machine built last, and may carry another agent. When
that cannot work here the docker tests skip with the reason, except on CI
(CI=true), where a missing engine must fail the build rather than hide it.
"""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest
from django.conf import settings

from sandboxes.providers.base import ProviderError
from sandboxes.providers.docker import DockerProvider
from tests.requirements import missing_part

ROOT = Path(__file__).resolve().parents[1]
TEST_INSTALLATION = f"pytest-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
"""Containers made by tests carry this installation label, apart from real ones, and apart
from another pytest-xdist worker's: a provider lists every container of its installation,
and fixtures destroy what their provider lists (tests/sandboxes/test_gvisor_isolation.py)."""

_lock = threading.Lock()
_outcome: tuple[DockerProvider | None, str] | None = None


def _prepare() -> tuple[DockerProvider | None, str]:
    image = ""
    for script, timeout_s in (("docker-up.sh", 120), ("build-sandbox-image.sh", 900)):
        try:
            done = subprocess.run(
                [str(ROOT / "scripts" / script)],
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"scripts/{script} could not run: {exc}"
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip()[-800:]
            return None, f"scripts/{script} failed (exit {done.returncode}): {tail}"
        image = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    if image and not os.environ.get("SANDPIT_DOCKER_IMAGE"):
        # Run outside scripts/test.sh (which exports it): the servers and the settings
        # this session builds providers from take this tree's image too.
        os.environ["SANDPIT_DOCKER_IMAGE"] = image
        settings.SANDPIT_DOCKER_IMAGE = image
    provider = DockerProvider(
        image=image or "sandpit-sandbox:latest", installation=TEST_INSTALLATION
    )
    try:
        provider.health()
    except ProviderError as exc:
        return None, f"the Docker engine does not answer: {exc.message}"
    return provider, ""


def docker_runsc_provider_or_skip() -> DockerProvider:
    """Like docker_provider_or_skip, with sandboxes under gVisor (scripts/docker-up.sh
    registers runsc with the engine); skips (fails on CI) where runsc is not registered."""
    image = docker_provider_or_skip().image
    provider = DockerProvider(image=image, installation=TEST_INSTALLATION, runtime="runsc")
    health = provider.health()
    if not health.ok:
        missing_part(f"gVisor (runsc) is not registered with the engine: {health.detail}")
    return provider


def docker_provider_or_skip() -> DockerProvider:
    """A provider on a running engine with the sandbox image built; skips (fails on CI) if not."""
    global _outcome
    with _lock:
        if _outcome is None:
            _outcome = _prepare()
    provider, reason = _outcome
    if provider is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"Docker is required on CI: {reason}", pytrace=False)
        pytest.skip(f"Docker unavailable: {reason}")
    return provider
