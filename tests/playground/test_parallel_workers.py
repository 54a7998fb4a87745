"""The suite runs on several pytest-xdist workers (scripts/test.sh): each must be an
installation of its own, or one worker's reconciler, pool or billing keys would reach the
sandboxes and counters of another (tests/conftest.py's pytest_configure)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from django.conf import settings
from django.core.cache import caches

from tests.docker_support import TEST_INSTALLATION
from tests.operations import test_docker_engines
from tests.servers import TEST_PORTS_FIRST, TEST_PORTS_PER_WORKER, free_port, worker_index


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
    # Redis keys: the cache the product uses (metrics, rate limits, keys) and the servers'.
    if "KEY_PREFIX" in settings.CACHES["default"]:
        assert caches["default"].key_prefix.endswith(f"-{worker}")
        assert os.environ["SANDPIT_REDIS_PREFIX"] == caches["default"].key_prefix


def test_test_servers_listen_on_ports_of_their_workers_own() -> None:
    ephemeral_low, _ = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    first = TEST_PORTS_FIRST + worker_index() * TEST_PORTS_PER_WORKER
    block = range(first, first + TEST_PORTS_PER_WORKER)
    # The blocks of the at most 4 workers, all below the range bind(0) draws from.
    assert TEST_PORTS_FIRST + 4 * TEST_PORTS_PER_WORKER <= ephemeral_low
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is not None:
        assert worker_index() == int(worker.removeprefix("gw"))
    taken = free_port()
    assert taken in block
    with socket.socket() as listener:  # a port something listens on is never handed out
        listener.bind(("127.0.0.1", taken))
        listener.listen()
        # A whole turn of the block: the walk comes back to the held port and must skip it.
        others = {free_port() for _ in range(TEST_PORTS_PER_WORKER)}
    assert taken not in others
    assert others <= set(block)


def test_tests_of_one_shared_engine_run_on_one_worker(pytestconfig: pytest.Config) -> None:
    """The second Docker engine is one per machine: under several workers, its tests are
    grouped onto one (a worker stopping it under another's test failed that test)."""
    mark = test_docker_engines.pytestmark
    assert (mark.name, mark.args) == ("xdist_group", ("second-docker-engine",))
    # pyproject's addopts, so `pytest -n N` run by hand groups them too.
    assert "--dist loadgroup" in " ".join(pytestconfig.getini("addopts")), pytestconfig.getini(
        "addopts"
    )


@pytest.mark.xdist_group("grouping-check")
@pytest.mark.parametrize("variant", ["first", "second"])
def test_a_grouped_test_carries_its_group_to_the_scheduler(
    request: pytest.FixtureRequest, variant: str
) -> None:
    """Under workers, `--dist loadgroup` sends a test to its group's worker by a suffix on its
    node id. pytest 9.2 moved the id pytest-xdist 3.8 writes that suffix to, and grouped tests
    ran side by side on two workers, unnoticed (pyproject pins pytest below 9.2)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:  # one process: no scheduler to tell
        return
    assert request.node.nodeid.endswith(f"[{variant}]@grouping-check"), request.node.nodeid
