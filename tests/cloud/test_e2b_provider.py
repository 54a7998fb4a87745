"""E2B specifics beyond the contract: the fake stays true to the SDK, errors are translated,
the provider is chosen by environment alone, and a missing key is a clear 503."""

from __future__ import annotations

import inspect
from datetime import UTC, datetime

import pytest

from sandboxes.providers import (
    CLOUD_CREDENTIALS,
    configured_provider_names,
    get_provider,
    reset_providers,
)
from sandboxes.providers.base import (
    ExecRequest,
    FileConflict,
    ProviderNotConfigured,
    SandboxGone,
    SandboxSpec,
)
from tests.conftest import assert_error
from tests.requirements import require_module

ALL_CLOUD_VARIABLES = sorted({v for alts in CLOUD_CREDENTIALS.values() for a in alts for v in a})


@pytest.fixture
def no_cloud_credentials(monkeypatch, settings):  # type: ignore[no-untyped-def]
    for variable in ALL_CLOUD_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
        setattr(settings, variable, "")
    reset_providers()
    yield
    reset_providers()


# ---------------------------------------------------------------------------
# the fake is the SDK's surface, not an invention
# ---------------------------------------------------------------------------


def _params(fn) -> set[str]:  # type: ignore[no-untyped-def]
    return {
        name
        for name, p in inspect.signature(fn).parameters.items()
        if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and name not in ("self", "cls")
    }


def test_fake_matches_sdk_signatures(fake_e2b_cloud):  # type: ignore[no-untyped-def]
    """Every method the fake offers exists in the SDK with (at least) the same parameters.
    (Reading the SDK's own classes is the point here, hence the TID251 exceptions.)"""
    e2b = require_module("e2b", "the e2b extra is not installed (pip install -e .[cloud])")
    from e2b.sandbox_sync.commands.command import Commands
    from e2b.sandbox_sync.commands.command_handle import CommandHandle
    from e2b.sandbox_sync.commands.pty import Pty
    from e2b.sandbox_sync.filesystem.filesystem import Filesystem
    from e2b.sandbox_sync.filesystem.watch_handle import WatchHandle
    from e2b.sandbox_sync.sandbox_api import SandboxApi

    from tests.cloud import fake_e2b

    pairs = [
        (fake_e2b._Commands, Commands),
        (fake_e2b._Pty, Pty),
        (fake_e2b._Files, Filesystem),
        (fake_e2b._Handle, CommandHandle),
        (fake_e2b._Watch, WatchHandle),
    ]
    for fake_cls, real_cls in pairs:
        for name, fn in vars(fake_cls).items():
            if name.startswith("_"):
                continue
            real = getattr(real_cls, name)
            assert _params(fn) <= _params(real), (real_cls.__name__, name)
    sandbox_cls = fake_e2b.fake_sandbox_class(fake_e2b_cloud)
    for name, real_name in [
        ("create", "create"),
        ("connect", "_cls_connect_sandbox"),  # Sandbox.connect(sandbox_id) is this variant
        ("list", "list"),
        ("get_host", "get_host"),
    ]:
        real = getattr(e2b.Sandbox, real_name)
        assert _params(getattr(sandbox_cls, name)) <= _params(real), name
    for name in ("get_info", "kill", "set_timeout", "get_metrics"):  # class-level variants
        fake = vars(sandbox_cls)[name].fn
        assert _params(fake) <= _params(getattr(SandboxApi, f"_cls_{name}")), name


# ---------------------------------------------------------------------------
# error translation and e2b-only behaviour
# ---------------------------------------------------------------------------


def test_wrong_api_key_is_not_configured_naming_the_variable(fake_e2b_cloud):  # type: ignore[no-untyped-def]
    from sandboxes.providers.e2b import E2BProvider
    from tests.cloud.fake_e2b import fake_sandbox_class

    provider = E2BProvider(api_key="wrong", sandbox_class=fake_sandbox_class(fake_e2b_cloud))
    with pytest.raises(ProviderNotConfigured, match="E2B_API_KEY"):
        provider.create(SandboxSpec(sandbox_id="x"))
    with pytest.raises(ProviderNotConfigured, match="E2B_API_KEY"):
        provider.health()


def test_health_reports_latency(e2b_provider):  # type: ignore[no-untyped-def]
    health = e2b_provider.health()
    assert health.ok and health.latency_ms >= 0


def test_sandbox_killed_elsewhere_is_gone(e2b_provider, fake_e2b_cloud):  # type: ignore[no-untyped-def]
    handle = e2b_provider.create(SandboxSpec(sandbox_id="gone"))
    e2b_provider.exec(handle.provider_id, ExecRequest(command="true"))  # cached connection
    fake_e2b_cloud.sandboxes.pop(handle.provider_id).destroy()  # gone behind our back
    with pytest.raises(SandboxGone):
        e2b_provider.get(handle.provider_id)
    with pytest.raises(SandboxGone):
        e2b_provider.exec(handle.provider_id, ExecRequest(command="true"))


def test_create_passes_template_env_network_and_metadata(e2b_provider, fake_e2b_cloud):  # type: ignore[no-untyped-def]
    handle = e2b_provider.create(
        SandboxSpec(sandbox_id="meta", env={"FOO": "bar"}, labels={"sandpit.org": "7"})
    )
    try:
        state = fake_e2b_cloud.sandboxes[handle.provider_id]
        assert state.template == "base"
        assert state.metadata == {
            "sandpit.org": "7",
            "sandpit.installation": "default",
            "sandpit.sandbox_id": "meta",
        }
        out = e2b_provider.exec(handle.provider_id, ExecRequest(command="echo $FOO; pwd"))
        assert out.stdout == b"bar\n/home/user\n"
        assert handle.labels["sandpit.sandbox_id"] == "meta"
    finally:
        e2b_provider.destroy(handle.provider_id)


def test_non_recursive_remove_of_non_empty_dir_conflicts(e2b_provider, sandbox):  # type: ignore[no-untyped-def]
    e2b_provider.write_file(sandbox, "d/f.txt", b"x")
    with pytest.raises(FileConflict):
        e2b_provider.remove(sandbox, "d")
    assert e2b_provider.exists(sandbox, "d/f.txt")


def test_set_timeout_reaches_the_sdk(e2b_provider, sandbox, fake_e2b_cloud):  # type: ignore[no-untyped-def]
    # Created with the spec's lifetime (a day); set_timeout moves E2B's kill timer.
    e2b_provider.set_timeout(sandbox, 3600)
    left = fake_e2b_cloud.sandboxes[sandbox].end_at - datetime.now(UTC)
    assert 3500 < left.total_seconds() <= 3600


def test_pty_honours_another_shell(e2b_provider, sandbox):  # type: ignore[no-untyped-def]
    from tests.sandboxes.test_provider_contract import read_pty_until

    pty = e2b_provider.open_pty(sandbox, shell="/bin/sh")  # noqa: S604 - a fixed shell
    try:
        pty.write(b'echo "shell=$0"\n')
        read_pty_until(pty, b"shell=/bin/sh")
    finally:
        pty.close()


# ---------------------------------------------------------------------------
# selection by environment, without code changes
# ---------------------------------------------------------------------------


def test_sandpit_providers_e2b_with_key_builds_the_adapter(settings, no_cloud_credentials):  # type: ignore[no-untyped-def]
    require_module("e2b", "the e2b extra is not installed (pip install -e .[cloud])")
    from sandboxes.providers.e2b import E2BProvider

    settings.SANDPIT_PROVIDERS = ["e2b"]
    settings.E2B_API_KEY = "e2b_live_key"
    provider = get_provider("e2b")
    assert isinstance(provider, E2BProvider)
    assert provider.name == "e2b"


def test_auto_detection_picks_e2b_when_only_its_key_is_set(settings, no_cloud_credentials):  # type: ignore[no-untyped-def]
    require_module("e2b", "the e2b extra is not installed (pip install -e .[cloud])")
    from sandboxes.providers.e2b import E2BProvider

    settings.SANDPIT_PROVIDERS = ["local", "auto"]
    settings.E2B_API_KEY = "e2b_live_key"
    assert configured_provider_names() == ["local", "e2b"]
    assert isinstance(get_provider("auto"), E2BProvider)


def test_auto_detection_follows_the_seed_order(settings, no_cloud_credentials):  # type: ignore[no-untyped-def]
    settings.SANDPIT_PROVIDERS = ["auto"]
    settings.E2B_API_KEY = "e2b_live_key"
    settings.DAYTONA_API_KEY = "d"
    settings.MODAL_TOKEN_ID = "id"
    assert configured_provider_names() == ["e2b", "daytona"]  # Modal needs both variables
    settings.MODAL_TOKEN_SECRET = "secret"
    assert configured_provider_names() == ["modal", "e2b", "daytona"]


def test_auto_without_credentials_names_the_variables(settings, no_cloud_credentials):  # type: ignore[no-untyped-def]
    settings.SANDPIT_PROVIDERS = ["auto"]
    assert configured_provider_names() == []
    with pytest.raises(ProviderNotConfigured, match="E2B_API_KEY"):
        get_provider("auto")


def test_missing_key_names_the_variable(settings, no_cloud_credentials):  # type: ignore[no-untyped-def]
    settings.SANDPIT_PROVIDERS = ["e2b"]
    with pytest.raises(ProviderNotConfigured, match="E2B_API_KEY"):
        get_provider("e2b")


def test_disabled_cloud_provider_says_how_to_enable_it(settings, no_cloud_credentials):  # type: ignore[no-untyped-def]
    settings.SANDPIT_PROVIDERS = ["local"]
    with pytest.raises(ProviderNotConfigured, match="SANDPIT_PROVIDERS and set E2B_API_KEY"):
        get_provider("e2b")


@pytest.mark.django_db
def test_create_through_api_without_key_is_503_naming_the_variable(  # type: ignore[no-untyped-def]
    api_a, settings, no_cloud_credentials
):
    settings.SANDPIT_PROVIDERS = ["local", "e2b"]
    error = assert_error(
        api_a.post("/api/v1/sandboxes", {"provider": "e2b"}, format="json"),
        503,
        "provider_not_configured",
    )
    assert "E2B_API_KEY" in error["message"]


@pytest.mark.django_db
def test_health_and_staff_dashboard_show_the_provider(client, settings, no_cloud_credentials):  # type: ignore[no-untyped-def]
    from playground.selectors import staff_provider_statuses

    settings.SANDPIT_PROVIDERS = ["e2b"]
    component = client.get("/health/ready").json()["components"]["provider:e2b"]
    assert component["status"] == "down"
    assert "E2B_API_KEY" in component["detail"]
    (status,) = staff_provider_statuses()
    assert (status.name, status.ok) == ("e2b", False)
    assert "E2B_API_KEY" in status.detail
