"""A container start the engine refuses with a permission error is asked once more
(sandboxes/providers/docker/create.py: start_container).

The refusal itself cannot be produced on demand here (seen about once in ten full test runs
under gVisor, rarer under runc, never reproduced), so these tests drive `start_container` with a stand-in for
the engine's API that refuses as the engine did; the real engine's starts are covered by the
provider contract suite."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from sandboxes.providers.base import ExecRequest, SandboxSpec
from sandboxes.providers.docker import create

APIError = create.docker.errors.APIError
"""The docker SDK's error, through the provider (only it may import docker)."""

SEEN_UNDER_GVISOR = (
    "OCI runtime start failed: starting container: starting root container: starting "
    'sandbox: creating process: failed to find initial working directory "/workspace": '
    "permission denied: unknown"
)
SEEN_UNDER_RUNC = (
    "failed to create shim task: OCI runtime create failed: runc create failed: unable to "
    'start container process: exec: "/usr/bin/tini": stat /usr/bin/tini: permission denied: '
    "unknown"
)
SEEN = (SEEN_UNDER_GVISOR, SEEN_UNDER_RUNC)


class Engine:
    """Answers `start` with the given refusals in turn, then starts."""

    def __init__(self, *refusals: str) -> None:
        self.refusals = list(refusals)
        self.starts: list[str] = []

    def start(self, cid: str) -> None:
        self.starts.append(cid)
        if self.refusals:
            raise APIError("400 Client Error", explanation=self.refusals.pop(0))


@pytest.fixture(autouse=True)
def _no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(create, "START_AGAIN_AFTER_S", 0.0)


@pytest.mark.parametrize("refusal", SEEN)
def test_a_permission_refusal_is_asked_once_more_and_logged(
    refusal: str, caplog: pytest.LogCaptureFixture
) -> None:
    engine = Engine(refusal)
    create.start_container(engine, "c0ffee" * 10)
    assert engine.starts == ["c0ffee" * 10] * 2
    assert "starting it once more" in caplog.text


def test_a_second_refusal_is_raised() -> None:
    engine = Engine(SEEN_UNDER_RUNC, SEEN_UNDER_GVISOR)
    with pytest.raises(APIError):
        create.start_container(engine, "c1")
    assert len(engine.starts) == 2


@pytest.mark.parametrize(
    "refusal",
    [
        'OCI runtime start failed: exec: "nope": executable file not found in $PATH',
        "driver failed programming external connectivity: permission denied",
        'OCI runtime create failed: exec: "nope": executable file not found in $PATH',
        "Cannot start container: no space left on device",
    ],
)
def test_any_other_refusal_is_raised_at_once(refusal: str) -> None:
    engine = Engine(refusal)
    with pytest.raises(APIError):
        create.start_container(engine, "c2")
    assert len(engine.starts) == 1


@pytest.mark.docker
def test_a_new_container_is_started_through_it(
    docker_provider: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the real engine: a create that starts a new container goes through
    start_container (so a refusal there would be asked once more)."""
    started: list[str] = []
    real = create.start_container

    def counting(api: Any, cid: str) -> None:
        started.append(cid)
        real(api, cid)

    monkeypatch.setattr(create, "start_container", counting)
    handle = docker_provider._start_new(SandboxSpec(sandbox_id=uuid.uuid4().hex))
    try:
        assert started == [handle.provider_id]
        assert docker_provider.exec(handle.provider_id, ExecRequest(command="true")).exit_code == 0
    finally:
        docker_provider.destroy(handle.provider_id)
