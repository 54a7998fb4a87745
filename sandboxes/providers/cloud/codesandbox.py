"""CodeSandbox: lifecycle only, over its REST API with httpx (no Python SDK exists).

CodeSandbox's official SDK is TypeScript-only, and commands and files go through its
"pitcher" WebSocket protocol, which has no documented HTTP API; so this adapter creates
(forks a template), lists and shuts down VMs and answers 501 for everything else.
Credentials: CSB_API_KEY (or CODESANDBOX_TOKEN). Verified here: nothing against
CodeSandbox itself; the request shapes follow the API the TypeScript SDK calls
(POST /sandbox/{id}/fork, POST /vm/{id}/start, POST /vm/{id}/shutdown, GET /sandbox).
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
    ProviderUnavailable,
    SandboxGone,
    SandboxHandle,
    SandboxSpec,
    SandboxState,
)
from sandboxes.providers.cloud.common import CloudConfig, not_supported
from sandboxes.providers.cloud.shell import ShellCloudProvider

API = "https://api.codesandbox.io"
DEFAULT_TEMPLATE = "pcz35m"
"""CodeSandbox's universal template id, the TypeScript SDK's default."""


class CodeSandboxProvider(ShellCloudProvider):
    """CodeSandbox VMs: create, get, list, destroy; exec and files answer 501."""

    name = "codesandbox"
    capabilities: frozenset[Any] = frozenset()

    def __init__(self, api_key: str, installation: str, base_url: str = API) -> None:
        super().__init__()
        import httpx

        self._http = httpx.Client(
            base_url=base_url, headers={"Authorization": f"Bearer {api_key}"}, timeout=60
        )
        self.installation = installation

    @classmethod
    def from_config(cls, config: CloudConfig) -> CodeSandboxProvider:
        key = config.get("CSB_API_KEY") or config.get("CODESANDBOX_TOKEN")
        if not key:
            config.require(["CSB_API_KEY"], "codesandbox")
        return cls(key, config.installation)

    @contextlib.contextmanager
    def _translate(self, provider_id: str | None = None) -> Iterator[None]:
        import httpx

        try:
            yield
        except httpx.HTTPStatusError as exc:
            status = exc.response.status_code
            if status in (401, 403):
                raise ProviderNotConfigured("CodeSandbox rejected CSB_API_KEY.") from exc
            if status == 404:
                raise SandboxGone(
                    f"Sandbox {provider_id} no longer exists in CodeSandbox."
                ) from exc
            raise ProviderError(f"CodeSandbox error {status}: {exc.response.text[:200]}") from exc
        except httpx.TransportError as exc:
            raise ProviderUnavailable(f"CodeSandbox cannot be reached: {exc}") from exc

    def _request(self, method: str, path: str, **kw: Any) -> Any:
        response = self._http.request(method, path, **kw)
        response.raise_for_status()
        return response.json().get("data", {}) if response.content else {}

    def _handle(self, data: dict[str, Any], state: SandboxState) -> SandboxHandle:
        created = data.get("created_at")
        return SandboxHandle(
            provider=self.name,
            provider_id=str(data["id"]),
            state=state,
            created_at=datetime.fromisoformat(created.replace("Z", "+00:00"))
            if created
            else datetime.now(UTC),
            labels={t: "" for t in data.get("tags", [])},
        )

    def _tag(self) -> str:
        return f"sandpit-{self.installation}"

    def create(self, spec: SandboxSpec) -> SandboxHandle:
        template = DEFAULT_TEMPLATE if spec.template in ("", "default") else spec.template
        with self._translate():
            data = self._request(
                "POST",
                f"/sandbox/{template}/fork",
                json={"title": f"sandpit-{spec.sandbox_id}", "tags": [self._tag()], "privacy": 2},
            )
            self._request("POST", f"/vm/{data['id']}/start", json={})
        return self._handle(data, SandboxState.RUNNING)

    def get(self, provider_id: str) -> SandboxHandle:
        with self._translate(provider_id):
            data = self._request("GET", f"/sandbox/{provider_id}")
        if self._tag() not in data.get("tags", []):
            raise SandboxGone(f"Sandbox {provider_id} does not belong to this installation.")
        return self._handle(data, SandboxState.RUNNING)

    def list_sandboxes(self) -> list[SandboxHandle]:
        with self._translate():
            data = self._request("GET", "/sandbox", params={"tags": self._tag()})
        return [self._handle(s, SandboxState.RUNNING) for s in data.get("sandboxes", [])]

    def destroy(self, provider_id: str) -> bool:
        try:
            self.get(provider_id)
        except SandboxGone:
            return False
        with self._translate(provider_id):
            self._request("POST", f"/vm/{provider_id}/shutdown", json={})
        return True

    def health(self) -> ProviderHealth:
        started = time.perf_counter()
        with self._translate():
            self._request("GET", "/sandbox", params={"page_size": 1})
        return ProviderHealth(
            ok=True,
            detail="codesandbox api reachable",
            latency_ms=(time.perf_counter() - started) * 1000,
        )

    def _shell(self, provider_id: str, script: str, timeout_s: float) -> tuple[bytes, int]:
        raise not_supported(
            self.name,
            "commands or files (CodeSandbox offers them only over its WebSocket protocol)",
        )
