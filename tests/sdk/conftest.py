"""The SDK and CLI against a real daphne (tests/realtime's server: local provider, docker
when SANDPIT_PROVIDERS enables it), with an API key of a premium organization."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from sandpit import Sandbox, Sandpit

from tests.realtime.conftest import (  # noqa: F401 - fixtures
    daphne_server,
    django_db_modify_db_settings,
    server,
)
from tests.requirements import missing_part

PROVIDERS = ["local", pytest.param("docker", marks=pytest.mark.docker)]


def require_provider(name: str) -> None:
    if name != "docker":
        return
    from django.conf import settings

    from tests.docker_support import docker_provider_or_skip

    if "docker" not in settings.SANDPIT_PROVIDERS:
        missing_part("SANDPIT_PROVIDERS does not enable docker")
    docker_provider_or_skip()


@pytest.fixture
def sdk_env(server, key_a, monkeypatch, tmp_path) -> dict[str, str]:  # type: ignore[no-untyped-def]  # noqa: F811
    """The environment a user of the SDK or CLI would have: URL and key, a private config dir."""
    env = {
        "SANDPIT_URL": server.http,
        "SANDPIT_API_KEY": key_a,
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.fixture
def client(sdk_env) -> Iterator[Sandpit]:  # type: ignore[no-untyped-def]
    with Sandpit() as sandpit:
        yield sandpit


@pytest.fixture(params=PROVIDERS)
def provider(request) -> str:  # type: ignore[no-untyped-def]
    require_provider(request.param)
    return str(request.param)


@pytest.fixture
def sbx(client, provider) -> Iterator[Sandbox]:  # type: ignore[no-untyped-def]
    sandbox = client.create(provider=provider, metadata={"suite": "sdk"})
    yield sandbox
    sandbox.kill()


@pytest.fixture
def local_sbx(client) -> Iterator[Sandbox]:  # type: ignore[no-untyped-def]
    sandbox = client.create(provider="local")
    yield sandbox
    sandbox.kill()


def cli_env(sdk_env: dict[str, str]) -> dict[str, str]:
    return {**os.environ, **sdk_env}
