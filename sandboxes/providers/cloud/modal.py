"""Modal sandboxes through the `modal` SDK (extra: sandpit[modal]).

Verified here: nothing against Modal itself (no network reaches it); the shared shell
layer this adapter relies on is tested locally. SDK calls used: Client.from_credentials,
App.lookup, Sandbox.create/from_id/list/terminate/poll/set_tags/exec.
"""

from __future__ import annotations

import contextlib
import math
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
from sandboxes.providers.cloud.shell import ShellCloudProvider


class ModalProvider(ShellCloudProvider):
    """Sandboxes in Modal (gVisor containers); `spec.template` is a registry image name."""

    name = "modal"
    workspace = "/workspace"

    def __init__(self, token_id: str, token_secret: str, app_name: str, installation: str):
        super().__init__()
        self._modal = import_sdk("modal", "modal", "modal")
        self._credentials = (token_id, token_secret)
        self._client_instance: Any = None
        self.app_name = app_name
        self.installation = installation

    @classmethod
    def from_config(cls, config: CloudConfig) -> ModalProvider:
        creds = config.require(["MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET"], "modal")
        return cls(
            creds["MODAL_TOKEN_ID"],
            creds["MODAL_TOKEN_SECRET"],
            config.get("MODAL_APP_NAME", "sandpit"),
            config.installation,
        )

    @contextlib.contextmanager
    def _translate(self, provider_id: str | None = None) -> Iterator[None]:
        errors = self._modal.exception
        try:
            yield
        except ProviderError:
            raise
        except errors.NotFoundError as exc:
            raise SandboxGone(f"Sandbox {provider_id} no longer exists in Modal.") from exc
        except errors.AuthError as exc:
            raise ProviderNotConfigured(
                f"Modal rejected MODAL_TOKEN_ID/MODAL_TOKEN_SECRET: {exc}"
            ) from exc
        except (errors.ConnectionError, ConnectionError, TimeoutError) as exc:
            raise ProviderUnavailable(f"Modal cannot be reached: {exc}") from exc
        except errors.Error as exc:
            raise ProviderError(f"Modal error: {exc}") from exc

    @property
    def _client(self) -> Any:
        """Built on first use: Modal's client connects when it is created."""
        if self._client_instance is None:
            with self._translate():
                self._client_instance = self._modal.Client.from_credentials(*self._credentials)
        return self._client_instance

    def _app(self) -> Any:
        return self._modal.App.lookup(self.app_name, create_if_missing=True, client=self._client)

    def _sandbox(self, provider_id: str) -> Any:
        with self._translate(provider_id):
            return self._modal.Sandbox.from_id(provider_id, client=self._client)

    def _handle(self, sandbox: Any, labels: dict[str, str]) -> SandboxHandle:
        running = sandbox.poll() is None
        return SandboxHandle(
            provider=self.name,
            provider_id=sandbox.object_id,
            state=SandboxState.RUNNING if running else SandboxState.STOPPED,
            created_at=datetime.now(UTC),  # Modal's SDK does not expose the creation time
            labels=labels,
        )

    def create(self, spec: SandboxSpec) -> SandboxHandle:
        modal = self._modal
        tags = {
            **spec.labels,
            "sandpit.installation": self.installation,
            "sandpit.sandbox_id": spec.sandbox_id,
        }
        image = (
            modal.Image.debian_slim()
            if spec.template in ("", "default")
            else modal.Image.from_registry(spec.template)
        )
        with self._translate():
            sandbox = modal.Sandbox.create(
                "sleep",
                "infinity",
                app=self._app(),
                image=image,
                env=check_env(spec.env),
                timeout=spec.lifetime_s,  # a kill timer: the lifetime, not the idle timeout
                workdir=self.workspace,
                cpu=spec.resources.cpu_count,
                memory=spec.resources.memory_mb,
                block_network=not spec.network,
                client=self._client,
            )
            sandbox.set_tags(tags, client=self._client)
            return self._handle(sandbox, tags)

    def get(self, provider_id: str) -> SandboxHandle:
        sandbox = self._sandbox(provider_id)
        with self._translate(provider_id):
            if sandbox.poll() is not None:
                raise SandboxGone(f"Sandbox {provider_id} has finished.")
            return self._handle(sandbox, dict(sandbox.get_tags()))

    def list_sandboxes(self) -> list[SandboxHandle]:
        tags = {"sandpit.installation": self.installation}
        with self._translate():
            app = self._app()
            return [
                self._handle(sb, tags)
                for sb in self._modal.Sandbox.list(
                    app_id=app.app_id, tags=tags, client=self._client
                )
            ]

    def destroy(self, provider_id: str) -> bool:
        try:
            sandbox = self._sandbox(provider_id)
        except SandboxGone:
            return False
        with self._translate(provider_id):
            if sandbox.poll() is not None:
                return False
            sandbox.terminate()
            return True

    def health(self) -> ProviderHealth:
        started = time.perf_counter()
        with self._translate():
            self._app()
        return ProviderHealth(
            ok=True,
            detail=f"modal app {self.app_name}",
            latency_ms=(time.perf_counter() - started) * 1000,
        )

    def _shell(self, provider_id: str, script: str, timeout_s: float) -> tuple[bytes, int]:
        sandbox = self._sandbox(provider_id)
        with self._translate(provider_id):
            process = sandbox.exec("sh", "-c", script, timeout=math.ceil(timeout_s), text=False)
            code = process.wait()
            return bytes(process.stdout.read()), int(code)
