"""Blaxel sandboxes through the `blaxel` SDK's sync API (extra: sandpit[blaxel]).

Verified here: nothing against Blaxel itself (no network reaches it); the shared shell
layer is tested locally. The SDK reads BL_API_KEY and BL_WORKSPACE from the environment;
we check they are set. SDK calls used: SyncSandboxInstance.create/get/list/delete and
sandbox.process.exec(wait_for_completion=True).
"""

from __future__ import annotations

import contextlib
import math
import shlex
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from sandboxes.providers.base import (
    ProviderError,
    ProviderHealth,
    SandboxGone,
    SandboxHandle,
    SandboxSpec,
    SandboxState,
)
from sandboxes.providers.cloud.common import CloudConfig, import_sdk
from sandboxes.providers.cloud.shell import ShellCloudProvider, label_filter

_DEFAULT_IMAGE = "blaxel/base-image:latest"


class BlaxelProvider(ShellCloudProvider):
    """Blaxel sandboxes; `spec.template` is an image (default blaxel/base-image)."""

    name = "blaxel"
    workspace = "/blaxel"

    def __init__(self, installation: str):
        super().__init__()
        self._sdk = import_sdk("blaxel.core.sandbox", "blaxel", "blaxel")
        self.installation = installation

    @classmethod
    def from_config(cls, config: CloudConfig) -> BlaxelProvider:
        config.require(["BL_API_KEY", "BL_WORKSPACE"], "blaxel")
        return cls(config.installation)

    @contextlib.contextmanager
    def _translate(self, provider_id: str | None = None) -> Iterator[None]:
        core = import_sdk("blaxel.core", "blaxel", "blaxel")
        try:
            yield
        except ProviderError:
            raise
        except core.SandboxAPIError as exc:
            if getattr(exc, "status_code", None) == 404:
                raise SandboxGone(f"Sandbox {provider_id} no longer exists in Blaxel.") from exc
            raise ProviderError(f"Blaxel error: {exc}") from exc

    def _instances(self) -> Any:
        return self._sdk.SyncSandboxInstance

    def _handle(self, instance: Any) -> SandboxHandle:
        meta = instance.metadata
        status = str(getattr(instance, "status", "") or "").upper()
        return SandboxHandle(
            provider=self.name,
            provider_id=meta.name,
            state=SandboxState.RUNNING
            if status in ("DEPLOYED", "RUNNING")
            else SandboxState.STOPPED,
            created_at=datetime.now(UTC),  # not exposed uniformly by the SDK
            labels=dict(getattr(meta, "labels", None) or {}),
        )

    def _sandbox(self, provider_id: str) -> Any:
        with self._translate(provider_id):
            instance = self._instances().get(provider_id)
        if not label_filter(getattr(instance.metadata, "labels", None), self.installation):
            raise SandboxGone(f"Sandbox {provider_id} does not belong to this installation.")
        return instance

    def create(self, spec: SandboxSpec) -> SandboxHandle:
        config = self._sdk.types.SandboxCreateConfiguration(
            name=f"sandpit-{spec.sandbox_id}"[:49],
            image=_DEFAULT_IMAGE if spec.template in ("", "default") else spec.template,
            memory=spec.resources.memory_mb,
            envs=[{"name": k, "value": v} for k, v in spec.env.items()],
            ttl=f"{max(1, math.ceil(spec.lifetime_s / 60))}m",  # a kill timer: the lifetime
            labels={
                **spec.labels,
                "sandpit.installation": self.installation,
                "sandpit.sandbox_id": spec.sandbox_id,
            },
        )
        with self._translate():
            return self._handle(self._instances().create(config))

    def get(self, provider_id: str) -> SandboxHandle:
        return self._handle(self._sandbox(provider_id))

    def list_sandboxes(self) -> list[SandboxHandle]:
        with self._translate():
            return [
                self._handle(i)
                for i in self._instances().list()
                if label_filter(getattr(i.metadata, "labels", None), self.installation)
            ]

    def destroy(self, provider_id: str) -> bool:
        try:
            self._sandbox(provider_id)
        except SandboxGone:
            return False
        with self._translate(provider_id):
            self._instances().delete(provider_id)
        return True

    def health(self) -> ProviderHealth:
        started = time.perf_counter()
        with self._translate():
            self._instances().list(limit=1)
        return ProviderHealth(
            ok=True,
            detail="blaxel api reachable",
            latency_ms=(time.perf_counter() - started) * 1000,
        )

    def _shell(self, provider_id: str, script: str, timeout_s: float) -> tuple[bytes, int]:
        sandbox = self._sandbox(provider_id)
        with self._translate(provider_id):
            response = sandbox.process.exec(
                {
                    "command": f"sh -c {shlex.quote(script)}",
                    "wait_for_completion": True,
                    "timeout": math.ceil(timeout_s),
                }
            )
        return (response.stdout or "").encode(), int(response.exit_code)
