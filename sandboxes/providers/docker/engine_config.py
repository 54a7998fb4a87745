"""SANDPIT_DOCKER_HOSTS: the Docker engines of the `docker` provider, and one engine's state.

SANDPIT_DOCKER_HOSTS lists the engines, separated by commas or whitespace; each is a URL
with options after `#`, joined by `&`:

    unix:///var/run/docker.sock#name=a,
    tcp://10.0.0.7:2376#name=b&label=gpu&tls_ca=/etc/sandpit/ca.pem&tls_cert=/etc/sandpit/cert.pem&tls_key=/etc/sandpit/key.pem

Options: `name` (required with several engines; what Sandbox.engine records), `label`
(repeatable: what organizations or templates may require), `tls=1` (TLS with the system's
CAs), `tls_ca`/`tls_cert`/`tls_key` (files; any of them turns TLS on and verifies),
`memory_mb` (the memory placement plans with; default the engine's MemTotal) and
`max_sandboxes` (a hard cap of running sandboxes on the engine; default none) and
`drain=1` (no new sandboxes there; those running carry on). Empty: one engine named
"default" at DOCKER_HOST, as before.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import docker.tls

from sandboxes.providers.base import ProviderNotConfigured

DEFAULT_ENGINE = "default"
LABEL_ENGINE = "engine"
"""Container label (under the provider's prefix): the engine's name."""
LABEL_MEMORY = "memory_mb"
"""Container label: the sandbox's memory limit, which placement adds up per engine."""
REQUIRED_LABEL = "sandpit.engine_label"
"""Spec label set by Sandpit: the engine label the sandbox requires ('' or absent: any)."""
PROBE_TIMEOUT_S = 3
"""How long a ping or list waits for an engine before it counts as not answering."""
DOWN_RETRY_S = 5.0
"""How long an engine that did not answer fails calls at once before it is tried again."""
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
_OPTIONS = {
    "name",
    "label",
    "tls",
    "tls_ca",
    "tls_cert",
    "tls_key",
    "memory_mb",
    "max_sandboxes",
    "drain",
}
_YES = ("1", "true", "yes")


@dataclass(frozen=True)
class EngineConfig:
    """One SANDPIT_DOCKER_HOSTS entry."""

    name: str
    url: str
    labels: frozenset[str] = frozenset()
    tls: bool = False
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    memory_mb: int = 0
    """The memory placement plans with; 0: the engine's own MemTotal."""
    max_sandboxes: int = 0
    """Most running sandboxes placed on it; 0: no cap."""
    drain: bool = False
    """No new sandboxes; those it runs carry on (before maintenance or removal)."""

    def tls_config(self) -> docker.tls.TLSConfig | None:
        if not (self.tls or self.tls_ca or self.tls_cert or self.tls_key):
            return None
        cert = (self.tls_cert, self.tls_key) if self.tls_cert and self.tls_key else None
        return docker.tls.TLSConfig(client_cert=cert, ca_cert=self.tls_ca or None, verify=True)

    @property
    def shown_url(self) -> str:
        """The URL without options (TLS file paths stay out of health pages)."""
        return self.url


def parse_engines(value: str, default_url: str) -> list[EngineConfig]:
    """SANDPIT_DOCKER_HOSTS -> engines, in order (the first keeps bare provider ids).
    Raises ProviderNotConfigured naming what is wrong."""
    entries = [entry for entry in re.split(r"[\s,]+", value.strip()) if entry]
    if not entries:
        return [EngineConfig(name=DEFAULT_ENGINE, url=default_url)]
    engines: list[EngineConfig] = []
    for entry in entries:
        url, _, fragment = entry.partition("#")
        if not url.startswith(("unix://", "tcp://")):
            raise ProviderNotConfigured(
                f"SANDPIT_DOCKER_HOSTS: {url!r} is not a unix:// or tcp:// engine URL."
            )
        options: dict[str, str] = {}
        labels: set[str] = set()
        for pair in filter(None, fragment.split("&")):
            key, sep, val = pair.partition("=")
            if not sep or key not in _OPTIONS:
                raise ProviderNotConfigured(
                    f"SANDPIT_DOCKER_HOSTS: unknown option {pair!r} for {url} "
                    f"(known: {', '.join(sorted(_OPTIONS))})."
                )
            if key == "label":
                labels.add(val)
            else:
                options[key] = val
        name = options.get("name") or (DEFAULT_ENGINE if len(entries) == 1 else "")
        if not _NAME.fullmatch(name):
            raise ProviderNotConfigured(
                f"SANDPIT_DOCKER_HOSTS: {url} needs a name=<a-z0-9._-> option "
                "(required when there are several engines)."
            )
        try:
            memory_mb = int(options.get("memory_mb") or 0)
            max_sandboxes = int(options.get("max_sandboxes") or 0)
        except ValueError:
            raise ProviderNotConfigured(
                f"SANDPIT_DOCKER_HOSTS: memory_mb and max_sandboxes of {name} are integers."
            ) from None
        engines.append(
            EngineConfig(
                name=name,
                url=url,
                labels=frozenset(labels),
                tls=options.get("tls", "") in _YES,
                tls_ca=options.get("tls_ca", ""),
                tls_cert=options.get("tls_cert", ""),
                tls_key=options.get("tls_key", ""),
                memory_mb=memory_mb,
                max_sandboxes=max_sandboxes,
                drain=options.get("drain", "") in _YES,
            )
        )
    names = [engine.name for engine in engines]
    if len(set(names)) != len(names):
        raise ProviderNotConfigured(f"SANDPIT_DOCKER_HOSTS: engine names repeat ({names}).")
    return engines


@dataclass(frozen=True)
class EngineStatus:
    """One engine as seen now."""

    name: str
    url: str
    labels: tuple[str, ...]
    ok: bool
    detail: str
    latency_ms: float
    sandboxes: int = 0
    """Running sandboxes of this installation on it."""
    memory_reserved_mb: int = 0
    """Sum of their memory limits."""
    memory_capacity_mb: int = 0
    max_sandboxes: int = 0
    runtimes: tuple[str, ...] = ()
    sandbox_ids: frozenset[str] = field(default=frozenset(), repr=False)
