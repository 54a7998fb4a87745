"""Every cloud provider is chosen by environment alone and names its missing credentials.

Building an adapter makes no network call, so with (fake) credentials each one builds here;
what its SDK does against the real service is not verified (see README_CLOUD.md).
"""

from __future__ import annotations

import importlib.util

import pytest

from sandboxes.providers import CLOUD_CREDENTIALS, get_provider, reset_providers
from sandboxes.providers.base import Capability, ProviderNotConfigured
from tests.requirements import missing_part

SDK_MODULE = {
    "modal": "modal",
    "e2b": "e2b",
    "daytona": "daytona",
    "codesandbox": "httpx",
    "vercel": "vercel",
    "blaxel": "blaxel",
    "runloop": "runloop_api_client",
}


@pytest.fixture
def clean_env(monkeypatch, settings):  # type: ignore[no-untyped-def]
    for alternatives in CLOUD_CREDENTIALS.values():
        for variables in alternatives:
            for variable in variables:
                monkeypatch.delenv(variable, raising=False)
    settings.E2B_API_KEY = ""
    reset_providers()
    yield monkeypatch
    reset_providers()


@pytest.mark.parametrize("name", list(CLOUD_CREDENTIALS))
def test_missing_credentials_are_named(name, settings, clean_env):  # type: ignore[no-untyped-def]
    settings.SANDPIT_PROVIDERS = [name]
    first = CLOUD_CREDENTIALS[name][0]
    with pytest.raises(ProviderNotConfigured) as excinfo:
        get_provider(name)
    for variable in first:
        assert variable in excinfo.value.message


@pytest.mark.parametrize("name", list(CLOUD_CREDENTIALS))
def test_credentials_in_the_environment_build_the_adapter(name, settings, clean_env):  # type: ignore[no-untyped-def]
    if importlib.util.find_spec(SDK_MODULE[name]) is None:
        missing_part(f"the {name} extra is not installed")
    settings.SANDPIT_PROVIDERS = ["auto"]
    for variable in CLOUD_CREDENTIALS[name][0]:
        clean_env.setenv(variable, "test-value")
    if name == "e2b":
        settings.E2B_API_KEY = "test-value"
    provider = get_provider("auto")
    assert provider.name == name
    assert isinstance(provider.capabilities, frozenset)
    if name != "codesandbox":
        assert {Capability.EXEC, Capability.FILES} <= provider.capabilities


def test_codesandbox_declares_nothing_it_cannot_do(settings, clean_env):  # type: ignore[no-untyped-def]
    settings.SANDPIT_PROVIDERS = ["codesandbox"]
    clean_env.setenv("CODESANDBOX_TOKEN", "t")
    assert get_provider("codesandbox").capabilities == frozenset()
