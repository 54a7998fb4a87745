"""Several Docker engines behind the `docker` provider: placement and routing.

The engine list (SANDPIT_DOCKER_HOSTS) is parsed in engine_config.py; the sandbox
operations are routed.py's.

Placement (`create`): among the engines that carry the label the sandbox requires (the
`sandpit.engine_label` label of the spec), answer, have the sandbox's runtime and image and
are under their cap, the one with the most memory left after the sandbox's limit (the memory limits
of its running sandboxes and of the creates in flight in this process subtracted); ties
go to the one running fewer. Memory is planned, not enforced: when every engine is full
the sandbox still goes to the least full one. Each engine's state is read from the engine
itself (one list call per engine and create), so several web and worker processes place
without talking to each other; creates racing in different processes may pick the same
engine, which only makes the spread uneven.

Routing: a provider_id names its engine. Sandboxes on the first engine have the bare
container id (so a one-engine installation's ids are what they always were, and adding
engines after it keeps existing rows valid: keep the first engine first); on any other
engine `<name>:<container id>`. Every operation on a sandbox goes to its engine.

An engine that does not answer (a failed probe, or a failed call followed by a failed probe)
is skipped by placement and fails calls at once for `DOWN_RETRY_S`, then is tried again.
Marking its sandboxes lost is Sandpit's (sandboxes/engines.py), not the provider's.

Methods that other modules add to DockerProvider and that take a `provider_id` first are
routed by `__getattr__`; with one engine every attribute passes through. A method
returning a new SandboxHandle must be wrapped here explicitly (its id needs its engine).
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import docker
import docker.errors

from sandboxes.providers.base import (
    Capability,
    ProviderError,
    ProviderHealth,
    ProviderNotConfigured,
    ProviderUnavailable,
    SandboxGone,
    SandboxHandle,
    SandboxSpec,
    SandboxStats,
)

from .claims import unclaimed
from .engine_config import (
    DEFAULT_ENGINE,
    DOWN_RETRY_S,
    LABEL_ENGINE,
    LABEL_MEMORY,
    PROBE_TIMEOUT_S,
    REQUIRED_LABEL,
    EngineConfig,
    EngineStatus,
    parse_engines,
)
from .errors import translate
from .provider import DockerProvider
from .routed import RoutedOperations


class DockerEngines(RoutedOperations):
    """The `docker` provider over one or more engines (see the module docstring)."""

    name = "docker"
    capabilities: frozenset[Capability]

    def __init__(
        self, engines: Sequence[EngineConfig], label_prefix: str = "sandpit", **options: Any
    ) -> None:
        """`options` are DockerProvider's (image, installation, runtime...), the same for
        every engine."""
        if not engines:
            raise ProviderNotConfigured("No Docker engine is configured.")
        self.engines: dict[str, EngineConfig] = {engine.name: engine for engine in engines}
        self.first = engines[0].name
        self.label_prefix = label_prefix
        self.providers: dict[str, DockerProvider] = {}
        for engine in engines:
            try:
                tls = engine.tls_config()
            except docker.errors.TLSParameterError as exc:
                raise ProviderNotConfigured(f"Docker engine '{engine.name}': {exc}") from None
            self.providers[engine.name] = DockerProvider(
                base_url=engine.url, tls=tls, label_prefix=label_prefix, **options
            )
        self.capabilities = self.providers[self.first].capabilities
        self._lock = threading.Lock()
        self._place_lock = threading.Lock()
        self._probe_clients: dict[str, Any] = {}
        self._info: dict[str, tuple[int, tuple[str, ...]]] = {}
        self._down: dict[str, tuple[float, str]] = {}
        self._images: set[tuple[str, str]] = set()
        self._pending: dict[str, dict[str, int]] = {engine.name: {} for engine in engines}

    # -- what every engine shares ---------------------------------------------------

    @property
    def _main(self) -> DockerProvider:
        return self.providers[self.first]

    @property
    def image(self) -> str:
        return self._main.image

    @property
    def runtime(self) -> str:
        return self._main.runtime

    @property
    def isolation(self) -> str:
        return self._main.isolation

    @property
    def installation(self) -> str:
        return self._main.installation

    def _label(self, key: str) -> str:
        return f"{self.label_prefix}.{key}"

    # -- ids and routing ---------------------------------------------------------------

    def provider_id(self, engine: str, cid: str) -> str:
        """The id Sandpit stores for container `cid` on `engine`."""
        return cid if engine == self.first else f"{engine}:{cid}"

    def engine_of(self, provider_id: str) -> tuple[str, str]:
        """(engine name, container id) of a provider_id. SandboxGone for an engine that is
        no longer configured."""
        engine, sep, cid = provider_id.partition(":")
        if not sep:
            engine, cid = self.first, provider_id
        if engine not in self.providers:
            raise SandboxGone(
                f"Sandbox {provider_id} is on Docker engine '{engine}', which is no longer "
                "in SANDPIT_DOCKER_HOSTS."
            )
        return engine, cid

    def _routed(self, provider_id: str, method: str, *args: Any, **kwargs: Any) -> Any:
        engine, cid = self.engine_of(provider_id)
        self._fail_fast(engine)
        try:
            return getattr(self.providers[engine], method)(cid, *args, **kwargs)
        except ProviderUnavailable:
            # Also raised for reasons of the sandbox's own (an outdated agent): only an
            # engine that then fails a probe is marked down.
            self._probe(engine)
            raise

    def _rehandle(self, engine: str, handle: SandboxHandle) -> SandboxHandle:
        return replace(handle, provider_id=self.provider_id(engine, handle.provider_id))

    def __getattr__(self, attr: str) -> Any:
        """Methods added to DockerProvider elsewhere: routed by their provider_id."""
        if attr.startswith("_") or "providers" not in self.__dict__:
            raise AttributeError(attr)
        value = getattr(self.providers[self.first], attr)
        if len(self.providers) == 1:
            return value
        if callable(value):
            params = list(inspect.signature(value).parameters)
            if params and params[0] == "provider_id":

                def routed(provider_id: str, *args: Any, **kwargs: Any) -> Any:
                    return self._routed(provider_id, attr, *args, **kwargs)

                return routed
        raise AttributeError(
            f"DockerEngines cannot route {attr!r} over several engines (it takes no "
            "provider_id): wrap it in sandboxes/providers/docker/engines.py."
        )

    # -- engine state --------------------------------------------------------------------

    def _client(self, engine: str) -> Any:
        with self._lock:
            client = self._probe_clients.get(engine)
        if client is None:
            config = self.engines[engine]
            with translate():
                client = docker.APIClient(
                    base_url=config.url,
                    version="auto",
                    timeout=PROBE_TIMEOUT_S,
                    tls=config.tls_config() or False,
                )
            with self._lock:
                self._probe_clients[engine] = client
        return client

    def _fail_fast(self, engine: str) -> None:
        """ProviderUnavailable while `engine` did not answer less than DOWN_RETRY_S ago."""
        with self._lock:
            down = self._down.get(engine)
        if down is not None and time.monotonic() - down[0] < DOWN_RETRY_S:
            raise ProviderUnavailable(f"The Docker engine '{engine}' is not answering: {down[1]}")

    def _probe(self, engine: str, force: bool = False) -> EngineStatus:
        """List one engine's running sandboxes (its memory and runtimes once): its status now. Without
        `force`, an engine that did not answer less than DOWN_RETRY_S ago is not asked."""
        config = self.engines[engine]
        labels = tuple(sorted(config.labels))
        started = time.perf_counter()
        with self._lock:
            down = self._down.get(engine)
        if not force and down is not None and time.monotonic() - down[0] < DOWN_RETRY_S:
            return EngineStatus(
                name=engine,
                url=config.shown_url,
                labels=labels,
                ok=False,
                detail=down[1],
                latency_ms=0.0,
                max_sandboxes=config.max_sandboxes,
            )
        try:
            client = self._client(engine)
            with translate():
                # No ping first: the list below answers only when the engine does.
                if engine not in self._info:
                    info = client.info()
                    runtimes = tuple(sorted(info.get("Runtimes") or {}))
                    self._info[engine] = (int(info.get("MemTotal") or 0) // 2**20, runtimes)
                rows = client.containers(
                    filters={
                        "label": [
                            f"{self._label('managed')}=1",
                            f"{self._label('installation')}={self.installation}",
                        ],
                        "status": "running",
                    }
                )
        except ProviderError as exc:
            if not isinstance(exc, ProviderUnavailable):
                exc = ProviderUnavailable(exc.message)
            with self._lock:
                self._down[engine] = (time.monotonic(), exc.message)
                self._info.pop(engine, None)  # re-read when it is back: it may have changed
            return EngineStatus(
                name=engine,
                url=config.shown_url,
                labels=labels,
                ok=False,
                detail=exc.message,
                latency_ms=(time.perf_counter() - started) * 1000,
                max_sandboxes=config.max_sandboxes,
            )
        with self._lock:
            self._down.pop(engine, None)
        memory_total_mb, runtimes = self._info.get(engine, (0, ()))
        # A warm pool's idle containers (pool.py) are not sandboxes: neither cap nor plan.
        rows = [
            row
            for row in rows
            if not unclaimed(
                self._main, str((row.get("Names") or [""])[0]), row.get("Labels") or {}
            )
        ]
        reserved = 0
        for row in rows:
            try:
                reserved += int((row.get("Labels") or {}).get(self._label(LABEL_MEMORY)) or 0)
            except ValueError:
                continue
        return EngineStatus(
            name=engine,
            url=config.shown_url,
            labels=labels,
            ok=True,
            detail=f"docker engine at {config.shown_url}",
            latency_ms=(time.perf_counter() - started) * 1000,
            sandboxes=len(rows),
            memory_reserved_mb=reserved,
            memory_capacity_mb=config.memory_mb or memory_total_mb,
            max_sandboxes=config.max_sandboxes,
            runtimes=runtimes,
            sandbox_ids=frozenset(
                str((row.get("Labels") or {}).get(self._label("sandbox_id")) or "") for row in rows
            ),
        )

    def _has_image(self, engine: str, image: str) -> bool:
        """Whether `engine` holds `image` (a yes is remembered; a no is asked again)."""
        with self._lock:
            if (engine, image) in self._images:
                return True
        try:
            with translate():
                self._client(engine).inspect_image(image)
        except ProviderError:
            return False
        with self._lock:
            self._images.add((engine, image))
        return True

    def engine_statuses(self) -> list[EngineStatus]:
        """Every engine's status now, in SANDPIT_DOCKER_HOSTS order (one probe each)."""
        return [self._probe(engine, force=True) for engine in self.engines]

    # -- placement ------------------------------------------------------------------------

    def _place(self, spec: SandboxSpec, exclude: set[str]) -> str:
        """The engine for `spec` (see the module docstring); registers it in flight."""
        required = str(spec.labels.get(REQUIRED_LABEL) or "")
        labelled = [e for e in self.engines.values() if not required or required in e.labels]
        if not labelled:
            raise ProviderNotConfigured(
                f"No Docker engine has the label {required!r} this sandbox requires "
                "(SANDPIT_DOCKER_HOSTS)."
            )
        runtime = spec.runtime or self.runtime
        # A template's image is built on one engine (sandboxes/templates.py): its sandboxes
        # go where it is, unless the operator copied it to others.
        image = str(getattr(spec, "image", "") or self.image)
        memory_mb = spec.resources.memory_mb
        reasons: list[str] = []
        with self._place_lock:
            best: tuple[tuple[bool, int, int], str] | None = None
            for engine in labelled:
                if engine.name in exclude:
                    continue
                if engine.drain:
                    reasons.append(f"{engine.name}: draining")
                    continue
                status = self._probe(engine.name)
                if not status.ok:
                    reasons.append(f"{engine.name}: {status.detail}")
                    continue
                if status.runtimes and runtime not in status.runtimes:
                    reasons.append(f"{engine.name}: no runtime {runtime}")
                    continue
                if not self._has_image(engine.name, image):
                    reasons.append(f"{engine.name}: no image {image}")
                    continue
                pending = {
                    k: v
                    for k, v in self._pending[engine.name].items()
                    if k not in status.sandbox_ids
                }
                running = status.sandboxes + len(pending)
                if engine.max_sandboxes and running >= engine.max_sandboxes:
                    reasons.append(f"{engine.name}: at its cap of {engine.max_sandboxes}")
                    continue
                free_mb = (
                    status.memory_capacity_mb
                    - status.memory_reserved_mb
                    - sum(pending.values())
                    - memory_mb
                )
                key = (free_mb >= 0, free_mb, -running)
                if best is None or key > best[0]:
                    best = (key, engine.name)
            if best is None:
                wanted = f" labelled {required!r}" if required else ""
                raise ProviderUnavailable(
                    f"No Docker engine{wanted} can take the sandbox now ({'; '.join(reasons)})."
                )
            self._pending[best[1]][spec.sandbox_id] = memory_mb
            return best[1]

    # -- lifecycle -------------------------------------------------------------------------

    def create(self, spec: SandboxSpec) -> SandboxHandle:
        """Place, then create on the chosen engine; an engine that fails to answer during
        the create is left for the next one."""
        tried: set[str] = set()
        while True:
            engine = self._place(spec, tried) if len(self.engines) > 1 else self.first
            labels = {
                **spec.labels,
                self._label(LABEL_ENGINE): engine,
                self._label(LABEL_MEMORY): str(spec.resources.memory_mb),
            }
            try:
                self._fail_fast(engine)
                handle = self.providers[engine].create(replace(spec, labels=labels))
            except ProviderUnavailable:
                if len(self.engines) == 1 or self._probe(engine).ok:
                    raise
                tried.add(engine)
                continue
            finally:
                with self._place_lock:
                    self._pending[engine].pop(spec.sandbox_id, None)
            # Set here too: a container claimed from a warm pool has the pool's labels.
            labels = {**handle.labels, self._label(LABEL_ENGINE): engine}
            return replace(self._rehandle(engine, handle), labels=labels)

    def get(self, provider_id: str) -> SandboxHandle:
        engine, _ = self.engine_of(provider_id)
        handle: SandboxHandle = self._routed(provider_id, "get")
        return self._rehandle(engine, handle)

    def list_sandboxes(self) -> list[SandboxHandle]:
        """Sandboxes on every engine that answers; ProviderUnavailable only when none does
        (a sandbox on an engine that is down is neither listed nor gone)."""
        handles: list[SandboxHandle] = []
        errors: list[str] = []
        for engine, provider in self.providers.items():
            try:
                self._fail_fast(engine)
                handles += [self._rehandle(engine, h) for h in provider.list_sandboxes()]
            except ProviderUnavailable as exc:
                self._probe(engine)
                errors.append(f"{engine}: {exc.message}")
        if errors and len(errors) == len(self.providers):
            raise ProviderUnavailable("; ".join(errors))
        return handles

    def destroy(self, provider_id: str) -> bool:
        return bool(self._routed(provider_id, "destroy"))

    def set_timeout(self, provider_id: str, timeout_s: int) -> None:
        self._routed(provider_id, "set_timeout", timeout_s)

    def stats(self, provider_id: str) -> SandboxStats:
        result: SandboxStats = self._routed(provider_id, "stats")
        return result

    def health(self) -> ProviderHealth:
        """OK while at least one engine answers (new sandboxes can be placed); the detail
        names every engine's state. One engine: its own health, as before (raises
        ProviderUnavailable when it does not answer)."""
        if len(self.engines) == 1:
            return self._main.health()
        started = time.perf_counter()
        parts: list[str] = []
        any_ok = False
        for status in self.engine_statuses():
            if status.ok:
                health = self.providers[status.name].health()
                any_ok = any_ok or health.ok
                state = "ok" if health.ok else "not ready"
                parts.append(
                    f"{status.name}: {state}, {status.sandboxes} running, "
                    f"{status.memory_reserved_mb}/{status.memory_capacity_mb} MB reserved"
                    + ("" if health.ok else f" ({health.detail})")
                )
            else:
                parts.append(f"{status.name}: down ({status.detail})")
        return ProviderHealth(
            ok=any_ok,
            detail="docker engines: " + "; ".join(parts),
            latency_ms=(time.perf_counter() - started) * 1000,
        )

    def snapshot_remove(self, location: str) -> bool:
        """Snapshot archives are files on Sandpit's host, whichever engine ran the sandbox."""
        return bool(self._main.snapshot_remove(location))

    def warm_pool_start(self) -> None:
        """Every engine's warm pool starts filling."""
        for provider in self.providers.values():
            provider.warm_pool_start()

    def close(self) -> None:
        for client in self._probe_clients.values():
            client.close()
        for provider in self.providers.values():
            close = getattr(provider, "close", None)
            if close is not None:
                close()


def engines_of(provider: object) -> DockerEngines | None:
    """The engine fleet behind a provider instance, or None for other providers."""
    return provider if isinstance(provider, DockerEngines) else None


__all__ = [  # what the rest of Sandpit imports from here
    "DEFAULT_ENGINE",
    "REQUIRED_LABEL",
    "DockerEngines",
    "EngineConfig",
    "EngineStatus",
    "engines_of",
    "parse_engines",
]
