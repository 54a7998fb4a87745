"""Provider registry: builds each configured provider once per process from settings."""

from __future__ import annotations

import threading

from django.conf import settings

from .base import ProviderNotConfigured, SandboxProvider

KNOWN_PROVIDERS = ("local", "docker", "e2b")
_instances: dict[str, SandboxProvider] = {}
_lock = threading.Lock()


def configured_provider_names() -> list[str]:
    return list(settings.SANDPIT_PROVIDERS)


def _build(name: str) -> SandboxProvider:
    if name == "local":
        from .local import LocalProvider

        return LocalProvider(root_dir=settings.SANDPIT_LOCAL_ROOT)
    if name == "docker":
        from .docker import DockerProvider

        return DockerProvider(
            image=settings.SANDPIT_DOCKER_IMAGE, installation=settings.SANDPIT_INSTALLATION
        )
    if name == "e2b":
        if not settings.E2B_API_KEY:
            raise ProviderNotConfigured(
                "The e2b provider needs the E2B_API_KEY environment variable."
            )
        from .e2b import E2BProvider  # type: ignore[import-not-found]

        return E2BProvider(api_key=settings.E2B_API_KEY)
    raise ProviderNotConfigured(f"Unknown provider '{name}'. Known: {', '.join(KNOWN_PROVIDERS)}.")


def get_provider(name: str) -> SandboxProvider:
    """The process-wide instance of a configured provider."""
    if name not in configured_provider_names():
        raise ProviderNotConfigured(
            f"Provider '{name}' is not enabled here (SANDPIT_PROVIDERS="
            f"{','.join(configured_provider_names())})."
        )
    with _lock:
        provider = _instances.get(name)
        if provider is None:
            provider = _instances[name] = _build(name)
        return provider


def reset_providers() -> None:
    """Forget built providers (tests that change settings)."""
    with _lock:
        _instances.clear()
