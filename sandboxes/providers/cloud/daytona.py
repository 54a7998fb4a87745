"""Daytona sandboxes through the `daytona` SDK (extra: sandpit[daytona]).

Verified here: nothing against Daytona itself (no network reaches it); the shared shell
layer is tested locally. Daytona's `process.exec` merges stdout and stderr and has no
stdin, which the shell layer's framing works around. SDK calls used: Daytona(config),
create/get/list/delete, sandbox.process.exec, sandbox.set_autostop_interval.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from sandboxes.providers.base import (
    Capability,
    ProviderError,
    ProviderHealth,
    ProviderNotConfigured,
    ProviderUnavailable,
    SandboxGone,
    SandboxHandle,
    SandboxSpec,
    SandboxState,
)
from sandboxes.providers.cloud.common import CloudConfig, check_env, import_sdk
from sandboxes.providers.cloud.shell import ShellCloudProvider, label_filter

DEFAULT_API_URL = "https://app.daytona.io/api"


class DaytonaProvider(ShellCloudProvider):
    """Sandboxes in Daytona; `spec.template` names a Daytona snapshot."""

    name = "daytona"
    workspace = "/home/daytona"
    capabilities = ShellCloudProvider.capabilities | {Capability.TIMEOUT}

    def __init__(self, api_key: str, installation: str, api_url: str | None = None):
        super().__init__()
        self._sdk = import_sdk("daytona", "daytona", "daytona")
        self._client = self._sdk.Daytona(self._sdk.DaytonaConfig(api_key=api_key, api_url=api_url))
        self.installation = installation

    @classmethod
    def from_config(cls, config: CloudConfig) -> DaytonaProvider:
        key = config.require(["DAYTONA_API_KEY"], "daytona")["DAYTONA_API_KEY"]
        return cls(key, config.installation, config.get("DAYTONA_API_URL", DEFAULT_API_URL))

    @contextlib.contextmanager
    def _translate(self, provider_id: str | None = None) -> Iterator[None]:
        sdk = self._sdk
        try:
            yield
        except ProviderError:
            raise
        except sdk.DaytonaNotFoundError as exc:
            raise SandboxGone(f"Sandbox {provider_id} no longer exists in Daytona.") from exc
        except sdk.DaytonaAuthenticationError as exc:
            raise ProviderNotConfigured(f"Daytona rejected DAYTONA_API_KEY: {exc}") from exc
        except (sdk.DaytonaConnectionError, sdk.DaytonaTimeoutError, ConnectionError) as exc:
            raise ProviderUnavailable(f"Daytona cannot be reached: {exc}") from exc
        except sdk.DaytonaError as exc:
            raise ProviderError(f"Daytona error: {exc}") from exc

    def _handle(self, sandbox: Any) -> SandboxHandle:
        state = str(getattr(sandbox.state, "value", sandbox.state)).lower()
        created = getattr(sandbox, "created_at", None)
        if isinstance(created, str):
            created = datetime.fromisoformat(created.replace("Z", "+00:00"))
        return SandboxHandle(
            provider=self.name,
            provider_id=sandbox.id,
            state=SandboxState.RUNNING if state == "started" else SandboxState.STOPPED,
            created_at=created or datetime.now(UTC),
            labels=dict(sandbox.labels or {}),
        )

    def _sandbox(self, provider_id: str) -> Any:
        with self._translate(provider_id):
            sandbox = self._client.get(provider_id)
        if not label_filter(sandbox.labels, self.installation):
            raise SandboxGone(f"Sandbox {provider_id} does not belong to this installation.")
        return sandbox

    def create(self, spec: SandboxSpec) -> SandboxHandle:
        params = self._sdk.CreateSandboxFromSnapshotParams(
            snapshot=None if spec.template in ("", "default") else spec.template,
            labels={
                **spec.labels,
                "sandpit.installation": self.installation,
                "sandpit.sandbox_id": spec.sandbox_id,
            },
            env_vars=check_env(spec.env),
            # Daytona's own idle stop sees only its own API's activity, not Sandpit's
            # terminals and previews: the reaper owns the idle timeout, this is a backstop.
            auto_stop_interval=max(1, math.ceil(spec.lifetime_s / 60)),
            network_block_all=not spec.network,
        )
        with self._translate():
            return self._handle(self._client.create(params))

    def get(self, provider_id: str) -> SandboxHandle:
        return self._handle(self._sandbox(provider_id))

    def list_sandboxes(self) -> list[SandboxHandle]:
        query = self._sdk.ListSandboxesQuery(labels={"sandpit.installation": self.installation})
        with self._translate():
            return [self._handle(sb) for sb in self._client.list(query)]

    def destroy(self, provider_id: str) -> bool:
        try:
            sandbox = self._sandbox(provider_id)
        except SandboxGone:
            return False
        with self._translate(provider_id):
            self._client.delete(sandbox)
        return True

    def set_timeout(self, provider_id: str, timeout_s: int) -> None:
        """Renew the backstop: Daytona stops a sandbox after this many minutes (rounded up)
        without activity it sees; Sandpit passes the remaining lifetime."""
        sandbox = self._sandbox(provider_id)
        with self._translate(provider_id):
            sandbox.set_autostop_interval(max(1, math.ceil(timeout_s / 60)))

    def health(self) -> ProviderHealth:
        started = time.perf_counter()
        with self._translate():
            self._client.list(self._sdk.ListSandboxesQuery(limit=1))
        return ProviderHealth(
            ok=True,
            detail="daytona api reachable",
            latency_ms=(time.perf_counter() - started) * 1000,
        )

    def _shell(self, provider_id: str, script: str, timeout_s: float) -> tuple[bytes, int]:
        sandbox = self._sandbox(provider_id)
        with self._translate(provider_id):
            response = sandbox.process.exec(script, timeout=math.ceil(timeout_s))
        return (response.result or "").encode(), int(response.exit_code)
