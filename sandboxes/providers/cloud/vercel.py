"""Vercel Sandbox through the `vercel` SDK's sync API (extra: sandpit[vercel]).

Verified here: nothing against Vercel itself (no network reaches it); the shared shell
layer is tested locally. The SDK reads its credentials (VERCEL_OIDC_TOKEN, or VERCEL_TOKEN
with VERCEL_TEAM_ID and VERCEL_PROJECT_ID) from the environment; we check they are set
so a missing one is a clear error. SDK calls used: vercel.sandbox.sync.create_sandbox,
get_sandbox, query_sandboxes, SyncSandbox.run_process/stop.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from sandboxes.providers.base import (
    ProviderError,
    ProviderHealth,
    ProviderNotConfigured,
    SandboxGone,
    SandboxHandle,
    SandboxSpec,
    SandboxState,
)
from sandboxes.providers.cloud.common import CloudConfig, check_env, import_sdk
from sandboxes.providers.cloud.shell import ShellCloudProvider, label_filter


class VercelProvider(ShellCloudProvider):
    """Vercel Sandbox microVMs; `spec.template` is an image name (default: the SDK's)."""

    name = "vercel"
    workspace = "/vercel/sandbox"

    def __init__(self, installation: str):
        super().__init__()
        self._sdk = import_sdk("vercel.sandbox.sync", "vercel", "vercel")
        self.installation = installation

    @classmethod
    def from_config(cls, config: CloudConfig) -> VercelProvider:
        if not config.get("VERCEL_OIDC_TOKEN"):
            config.require(["VERCEL_TOKEN", "VERCEL_TEAM_ID", "VERCEL_PROJECT_ID"], "vercel")
        return cls(config.installation)

    @contextlib.contextmanager
    def _translate(self, provider_id: str | None = None) -> Iterator[None]:
        sdk = self._sdk
        try:
            yield
        except ProviderError:
            raise
        except sdk.SandboxCredentialsError as exc:
            raise ProviderNotConfigured(f"Vercel rejected its credentials: {exc}") from exc
        except (sdk.SandboxInvalidHandleError, sdk.SandboxTerminalStateError) as exc:
            raise SandboxGone(f"Sandbox {provider_id} is gone from Vercel.") from exc
        except sdk.SandboxError as exc:
            raise ProviderError(f"Vercel error: {exc}") from exc

    def _handle(self, sandbox: Any) -> SandboxHandle:
        status = str(getattr(sandbox.status, "value", sandbox.status)).lower()
        created = getattr(sandbox, "created_at", None)
        return SandboxHandle(
            provider=self.name,
            provider_id=sandbox.name,
            state=SandboxState.RUNNING if status == "running" else SandboxState.STOPPED,
            created_at=created if isinstance(created, datetime) else datetime.now(UTC),
            labels=dict(sandbox.tags or {}),
        )

    def _sandbox(self, provider_id: str) -> Any:
        with self._translate(provider_id):
            sandbox = self._sdk.get_sandbox(name=provider_id)
        if not label_filter(sandbox.tags, self.installation):
            raise SandboxGone(f"Sandbox {provider_id} does not belong to this installation.")
        return sandbox

    def create(self, spec: SandboxSpec) -> SandboxHandle:
        with self._translate():
            sandbox = self._sdk.create_sandbox(
                name=f"sandpit-{spec.sandbox_id}",
                image=None if spec.template in ("", "default") else spec.template,
                execution_time_limit=spec.lifetime_s,  # a kill timer: the lifetime
                env=check_env(spec.env),
                tags={
                    **spec.labels,
                    "sandpit.installation": self.installation,
                    "sandpit.sandbox_id": spec.sandbox_id,
                },
                destroy=False,
            )
            return self._handle(sandbox)

    def get(self, provider_id: str) -> SandboxHandle:
        return self._handle(self._sandbox(provider_id))

    def list_sandboxes(self) -> list[SandboxHandle]:
        with self._translate():
            return [
                self._handle(sb)
                for sb in self._sdk.query_sandboxes()
                if label_filter(sb.tags, self.installation)
            ]

    def destroy(self, provider_id: str) -> bool:
        try:
            sandbox = self._sandbox(provider_id)
        except SandboxGone:
            return False
        with self._translate(provider_id):
            sandbox.stop()
        return True

    def health(self) -> ProviderHealth:
        started = time.perf_counter()
        with self._translate():
            next(iter(self._sdk.query_sandboxes(page_size=1)), None)
        return ProviderHealth(
            ok=True,
            detail="vercel sandbox api reachable",
            latency_ms=(time.perf_counter() - started) * 1000,
        )

    def _shell(self, provider_id: str, script: str, timeout_s: float) -> tuple[bytes, int]:
        sandbox = self._sandbox(provider_id)
        with self._translate(provider_id):
            done = sandbox.run_process(
                "sh", ["-c", script], capture_output=True, kill_after=timeout_s
            )
        out = done.stdout if isinstance(done.stdout, bytes) else (done.stdout or "").encode()
        return out, int(done.returncode)
