"""Runloop devboxes through the `runloop_api_client` SDK (extra: sandpit[runloop]).

Verified here: nothing against Runloop itself (no network reaches it); the shared shell
layer is tested locally. SDK calls used: Runloop(bearer_token), devboxes.create_and_await_running,
retrieve, list, shutdown, execute_sync, keep_alive.
"""

from __future__ import annotations

import contextlib
import shlex
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from sandboxes.providers.base import (
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


class RunloopProvider(ShellCloudProvider):
    """Runloop devboxes; `spec.template` names a blueprint."""

    name = "runloop"
    workspace = "/home/user"

    def __init__(self, api_key: str, installation: str):
        super().__init__()
        self._sdk = import_sdk("runloop_api_client", "runloop", "runloop")
        self._client = self._sdk.Runloop(bearer_token=api_key)
        self.installation = installation

    @classmethod
    def from_config(cls, config: CloudConfig) -> RunloopProvider:
        key = config.require(["RUNLOOP_API_KEY"], "runloop")["RUNLOOP_API_KEY"]
        return cls(key, config.installation)

    @contextlib.contextmanager
    def _translate(self, provider_id: str | None = None) -> Iterator[None]:
        sdk = self._sdk
        try:
            yield
        except ProviderError:
            raise
        except sdk.NotFoundError as exc:
            raise SandboxGone(f"Devbox {provider_id} no longer exists in Runloop.") from exc
        except sdk.AuthenticationError as exc:
            raise ProviderNotConfigured(f"Runloop rejected RUNLOOP_API_KEY: {exc}") from exc
        except (sdk.APIConnectionError, sdk.APITimeoutError) as exc:
            raise ProviderUnavailable(f"Runloop cannot be reached: {exc}") from exc
        except sdk.APIError as exc:
            raise ProviderError(f"Runloop error: {exc}") from exc

    def _handle(self, devbox: Any) -> SandboxHandle:
        created = getattr(devbox, "create_time_ms", None)
        return SandboxHandle(
            provider=self.name,
            provider_id=devbox.id,
            state=SandboxState.RUNNING if devbox.status == "running" else SandboxState.STOPPED,
            created_at=datetime.fromtimestamp(created / 1000, UTC)
            if created
            else datetime.now(UTC),
            labels=dict(devbox.metadata or {}),
        )

    def _devbox(self, provider_id: str) -> Any:
        with self._translate(provider_id):
            devbox = self._client.devboxes.retrieve(provider_id)
        if devbox.status == "shutdown" or not label_filter(devbox.metadata, self.installation):
            raise SandboxGone(f"Devbox {provider_id} is gone.")
        return devbox

    def create(self, spec: SandboxSpec) -> SandboxHandle:
        options: dict[str, Any] = {
            "metadata": {
                **spec.labels,
                "sandpit.installation": self.installation,
                "sandpit.sandbox_id": spec.sandbox_id,
            },
            "environment_variables": check_env(spec.env),
            "name": f"sandpit-{spec.sandbox_id}",
        }
        if spec.template not in ("", "default"):
            options["blueprint_name"] = spec.template
        with self._translate():
            return self._handle(self._client.devboxes.create_and_await_running(**options))

    def get(self, provider_id: str) -> SandboxHandle:
        return self._handle(self._devbox(provider_id))

    def list_sandboxes(self) -> list[SandboxHandle]:
        with self._translate():
            return [
                self._handle(d)
                for d in self._client.devboxes.list(status="running")
                if label_filter(d.metadata, self.installation)
            ]

    def destroy(self, provider_id: str) -> bool:
        try:
            self._devbox(provider_id)
        except SandboxGone:
            return False
        with self._translate(provider_id):
            self._client.devboxes.shutdown(provider_id)
        return True

    def health(self) -> ProviderHealth:
        started = time.perf_counter()
        with self._translate():
            self._client.devboxes.list(limit=1)
        return ProviderHealth(
            ok=True,
            detail="runloop api reachable",
            latency_ms=(time.perf_counter() - started) * 1000,
        )

    def _shell(self, provider_id: str, script: str, timeout_s: float) -> tuple[bytes, int]:
        self._devbox(provider_id)
        with self._translate(provider_id):
            result = self._client.devboxes.execute_sync(
                provider_id, command=f"sh -c {shlex.quote(script)}", timeout=timeout_s
            )
        return (result.stdout or "").encode(), int(result.exit_status or 0)
