"""Provider registry: builds each configured provider once per process from settings.

SANDPIT_PROVIDERS lists the enabled providers. The entry "auto" stands for every cloud
provider whose credentials are present, in the order ComputeSDK auto-detects them
(Modal, E2B, Daytona, CodeSandbox, then Vercel, Blaxel, Runloop); `get_provider("auto")`
(and so SANDPIT_DEFAULT_PROVIDER=auto) is the first of those. Nothing is read at import
time: a missing credential is a ProviderNotConfigured naming the variable when the
provider is built. Every value comes from settings (settings.py reads the environment);
cloud adapters receive theirs in a CloudConfig.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from importlib import import_module

from django.conf import settings

from .base import ProviderNotConfigured, SandboxProvider
from .cloud.common import CloudConfig
from .docker import isolation_of
from .docker.engines import DockerEngines, parse_engines
from .local import LocalProvider

AUTO = "auto"
CLOUD_CREDENTIALS: dict[str, tuple[tuple[str, ...], ...]] = {
    # provider: alternative sets of variables; any complete set selects it
    "modal": (("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET"),),
    "e2b": (("E2B_API_KEY",),),
    "daytona": (("DAYTONA_API_KEY",),),
    "codesandbox": (("CSB_API_KEY",), ("CODESANDBOX_TOKEN",)),
    "vercel": (("VERCEL_TOKEN", "VERCEL_TEAM_ID", "VERCEL_PROJECT_ID"), ("VERCEL_OIDC_TOKEN",)),
    "blaxel": (("BL_API_KEY", "BL_WORKSPACE"),),
    "runloop": (("RUNLOOP_API_KEY",),),
}
"""In auto-detection order (the seeds' order first, then the other cloud providers)."""
CLOUD_OPTIONS: dict[str, tuple[str, ...]] = {
    "modal": ("MODAL_APP_NAME",),
    "daytona": ("DAYTONA_API_URL",),
}
"""Settings besides the credentials that a cloud adapter is built with."""
KNOWN_PROVIDERS = ("local", "docker", *CLOUD_CREDENTIALS)
_instances: dict[str, SandboxProvider] = {}
_lock = threading.Lock()


def credential(name: str) -> str:
    """A credential setting's value ('' when unset)."""
    return str(getattr(settings, name, "") or "")


def cloud_config(provider: str) -> CloudConfig:
    """What the `provider` adapter is built from: its credentials and options, from settings."""
    names = [v for variables in CLOUD_CREDENTIALS[provider] for v in variables]
    names += CLOUD_OPTIONS.get(provider, ())
    return CloudConfig(
        installation=settings.SANDPIT_INSTALLATION,
        values={name: credential(name) for name in names},
    )


def detected_cloud_providers() -> list[str]:
    """Cloud providers whose credentials are all present, in auto-detection order."""
    return [
        name
        for name, alternatives in CLOUD_CREDENTIALS.items()
        if any(all(credential(var) for var in variables) for variables in alternatives)
    ]


def configured_provider_names() -> list[str]:
    """SANDPIT_PROVIDERS with "auto" replaced by the detected cloud providers."""
    names: list[str] = []
    for name in settings.SANDPIT_PROVIDERS:
        for resolved in detected_cloud_providers() if name == AUTO else [name]:
            if resolved not in names:
                names.append(resolved)
    return names


def resolve_provider_name(name: str) -> str:
    """The provider "auto" stands for (the first detected cloud provider); others as is."""
    if name != AUTO:
        return name
    detected = detected_cloud_providers()
    if not detected:
        hints = "; ".join(
            f"{provider}: {' + '.join(alternatives[0])}"
            for provider, alternatives in CLOUD_CREDENTIALS.items()
        )
        raise ProviderNotConfigured(f"Provider 'auto' found no cloud credentials ({hints}).")
    return detected[0]


def _build_local() -> SandboxProvider:
    return LocalProvider(
        root_dir=settings.SANDPIT_LOCAL_ROOT,
        warm_pool=settings.SANDPIT_LOCAL_WARM_POOL,
        warm_pool_max=settings.SANDPIT_LOCAL_WARM_POOL_MAX,
        create_concurrency=settings.SANDPIT_LOCAL_CREATE_CONCURRENCY,
        host_uid_base=settings.SANDPIT_LOCAL_UID_BASE,
        host_uid_count=settings.SANDPIT_LOCAL_UID_COUNT,
        host_uid_lock_dir=settings.SANDPIT_LOCAL_UID_LOCK_DIR,
        root_in_memory=settings.SANDPIT_LOCAL_ROOT_IN_MEMORY,
        cgroup_version=settings.SANDPIT_LOCAL_CGROUPS,
    )


def _build_docker() -> SandboxProvider:
    return DockerEngines(
        parse_engines(settings.SANDPIT_DOCKER_HOSTS, settings.DOCKER_HOST),
        image=settings.SANDPIT_DOCKER_IMAGE,
        installation=settings.SANDPIT_INSTALLATION,
        runtime=settings.SANDPIT_DOCKER_RUNTIME,
        gvisor_network_runtime=settings.SANDPIT_DOCKER_GVISOR_NETWORK_RUNTIME,
        agent_dir=settings.VAR_DIR / "docker-agents",
        pool_size=settings.SANDPIT_DOCKER_POOL_SIZE,
        pool_max=settings.SANDPIT_DOCKER_POOL_MAX,
        create_concurrency=settings.SANDPIT_DOCKER_CREATE_CONCURRENCY,
    )


def _build_e2b() -> SandboxProvider:
    api_key = credential("E2B_API_KEY")
    if not api_key:
        raise ProviderNotConfigured("The e2b provider needs the E2B_API_KEY environment variable.")
    from .e2b import E2BProvider  # an optional provider: its adapter loads when it is built

    return E2BProvider(
        api_key=api_key,
        template=settings.E2B_TEMPLATE,
        domain=settings.E2B_DOMAIN or None,
        installation=settings.SANDPIT_INSTALLATION,
    )


def _build_cloud(module: str, cls: str) -> Callable[[], SandboxProvider]:
    def build() -> SandboxProvider:
        provider_cls = getattr(import_module(f".cloud.{module}", __name__), cls)
        provider: SandboxProvider = provider_cls.from_config(cloud_config(module))
        return provider

    return build


_BUILDERS: dict[str, Callable[[], SandboxProvider]] = {
    "local": _build_local,
    "docker": _build_docker,
    "e2b": _build_e2b,
    "modal": _build_cloud("modal", "ModalProvider"),
    "daytona": _build_cloud("daytona", "DaytonaProvider"),
    "codesandbox": _build_cloud("codesandbox", "CodeSandboxProvider"),
    "vercel": _build_cloud("vercel", "VercelProvider"),
    "blaxel": _build_cloud("blaxel", "BlaxelProvider"),
    "runloop": _build_cloud("runloop", "RunloopProvider"),
}


def _build(name: str) -> SandboxProvider:
    builder = _BUILDERS.get(name)
    if builder is None:
        raise ProviderNotConfigured(
            f"Unknown provider '{name}'. Known: {', '.join(KNOWN_PROVIDERS)}."
        )
    return builder()


def get_provider(name: str) -> SandboxProvider:
    """The process-wide instance of a configured provider ("auto": the first detected)."""
    enabled = configured_provider_names()
    if name == AUTO and AUTO not in settings.SANDPIT_PROVIDERS:
        raise ProviderNotConfigured(
            f"Provider 'auto' is not enabled here (SANDPIT_PROVIDERS={','.join(enabled)})."
        )
    name = resolve_provider_name(name)
    if name not in enabled:
        hint = ""
        if name in CLOUD_CREDENTIALS:
            needs = " or ".join(" + ".join(v) for v in CLOUD_CREDENTIALS[name])
            hint = f" Add it to SANDPIT_PROVIDERS and set {needs}."
        raise ProviderNotConfigured(
            f"Provider '{name}' is not enabled here (SANDPIT_PROVIDERS="
            f"{','.join(settings.SANDPIT_PROVIDERS)}).{hint}"
        )
    with _lock:
        provider = _instances.get(name)
        if provider is None:
            provider = _instances[name] = _build(name)
        return provider


def provider_isolation(provider: SandboxProvider, runtime: str = "") -> str:
    """What separates `provider`'s sandboxes (under Docker `runtime`, default the
    provider's) from the host kernel: 'gvisor', 'container', or '' where it does not say."""
    if provider.name == "docker":
        return isolation_of(runtime or str(getattr(provider, "runtime", "")))
    if provider.name == "local":
        return "container"
    return ""


def reset_providers() -> None:
    """Forget built providers (tests that change settings), releasing what they hold."""
    with _lock:
        for provider in _instances.values():
            close = getattr(provider, "close", None)
            if close is not None:
                close()
        _instances.clear()
