"""Provider fixtures: the contract suite runs against every provider with these."""

from __future__ import annotations

import uuid

import pytest

from sandboxes.providers.base import SandboxProvider, SandboxSpec


@pytest.fixture(scope="session")
def local_provider(tmp_path_factory):  # type: ignore[no-untyped-def]
    from sandboxes.providers.local import LocalProvider
    from tests.requirements import jail_root

    return LocalProvider(root_dir=jail_root("local-sandboxes"))


@pytest.fixture(scope="session")
def docker_provider():  # type: ignore[no-untyped-def]
    from tests.docker_support import docker_provider_or_skip

    return docker_provider_or_skip()


@pytest.fixture(scope="session")
def docker_runsc_provider():  # type: ignore[no-untyped-def]
    from tests.docker_support import docker_runsc_provider_or_skip

    return docker_runsc_provider_or_skip()


@pytest.fixture(scope="session")
def docker_relay_provider():  # type: ignore[no-untyped-def]
    """Docker reaching every agent through `docker exec` (the path of remote engines and
    gVisor), forced here on runc and a local engine."""
    from sandboxes.providers.docker import DockerProvider
    from tests.docker_support import TEST_INSTALLATION, docker_provider_or_skip

    image = docker_provider_or_skip().image
    return DockerProvider(image=image, installation=TEST_INSTALLATION, relay=True)


@pytest.fixture(
    params=[
        "local",
        pytest.param("docker", marks=pytest.mark.docker),
        pytest.param("docker-runsc", marks=pytest.mark.docker),
        pytest.param("docker-relay", marks=pytest.mark.docker),
    ]
)
def provider(request) -> SandboxProvider:  # type: ignore[no-untyped-def]
    return request.getfixturevalue(f"{request.param.replace('-', '_')}_provider")


@pytest.fixture
def sandbox(provider):  # type: ignore[no-untyped-def]
    handle = provider.create(SandboxSpec(sandbox_id=uuid.uuid4().hex))
    yield handle.provider_id
    provider.destroy(handle.provider_id)
