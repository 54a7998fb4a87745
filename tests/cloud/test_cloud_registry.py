"""Every cloud provider is chosen by its credential settings alone and names the missing ones.

Building an adapter makes no network call, so with (fake) credentials each one builds here;
what its SDK does against the real service is not verified (see README_CLOUD.md).
"""

from __future__ import annotations

import importlib.util

import pytest

from sandboxes.providers import (
    CLOUD_CREDENTIALS,
    cloud_config,
    configured_provider_names,
    get_provider,
    reset_providers,
)
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
    """No credential in settings, and none in the environment either: the registry must not
    find one there (settings.py is the only reader)."""
    for alternatives in CLOUD_CREDENTIALS.values():
        for variables in alternatives:
            for variable in variables:
                monkeypatch.delenv(variable, raising=False)
                setattr(settings, variable, "")
    reset_providers()
    yield settings
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
        setattr(settings, variable, "test-value")
    provider = get_provider("auto")
    assert provider.name == name
    assert isinstance(provider.capabilities, frozenset)
    if name != "codesandbox":
        assert {Capability.EXEC, Capability.FILES} <= provider.capabilities


def test_codesandbox_declares_nothing_it_cannot_do(settings, clean_env):  # type: ignore[no-untyped-def]
    settings.SANDPIT_PROVIDERS = ["codesandbox"]
    settings.CODESANDBOX_TOKEN = "t"
    assert get_provider("codesandbox").capabilities == frozenset()


def test_credentials_come_from_settings_not_the_environment(settings, clean_env, monkeypatch):  # type: ignore[no-untyped-def]
    settings.SANDPIT_PROVIDERS = ["auto"]
    monkeypatch.setenv("DAYTONA_API_KEY", "only-in-the-environment")
    assert configured_provider_names() == []
    settings.DAYTONA_API_KEY = "in-settings"
    assert configured_provider_names() == ["daytona"]


def test_an_adapter_is_built_from_its_own_settings(settings, clean_env):  # type: ignore[no-untyped-def]
    settings.SANDPIT_INSTALLATION = "inst-7"
    settings.DAYTONA_API_KEY = "k"
    settings.DAYTONA_API_URL = "https://daytona.internal/api"
    settings.MODAL_TOKEN_ID = "not-daytona's"
    config = cloud_config("daytona")
    assert config.installation == "inst-7"
    assert config.values == {
        "DAYTONA_API_KEY": "k",
        "DAYTONA_API_URL": "https://daytona.internal/api",
    }


def test_e2b_template_and_domain_come_from_settings(settings, clean_env):  # type: ignore[no-untyped-def]
    if importlib.util.find_spec("e2b") is None:
        missing_part("the e2b extra is not installed")
    settings.SANDPIT_PROVIDERS = ["e2b"]
    settings.E2B_API_KEY = "k"
    settings.E2B_TEMPLATE = "my-template"
    settings.E2B_DOMAIN = "e2b.internal"
    provider = get_provider("e2b")
    assert provider.template == "my-template"  # type: ignore[attr-defined]
    assert provider._opts["domain"] == "e2b.internal"  # type: ignore[attr-defined]
