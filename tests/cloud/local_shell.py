"""A ShellCloudProvider whose one primitive, `_shell`, runs `sh` locally.

Each sandbox is a directory bound at /home/user in a private mount namespace per call
(root and `unshare` needed), so the shared shell layer (exec framing, timeouts, files,
path and symlink checks) runs for real. It stands in for the SDK call each cloud adapter
makes in `_shell` (Modal's exec, Daytona's process.exec, ...), which cannot run here.
"""

from __future__ import annotations

import subprocess
import uuid
from datetime import UTC, datetime
from pathlib import Path

from sandboxes.providers.base import SandboxGone, SandboxHandle, SandboxSpec, SandboxState
from sandboxes.providers.cloud.shell import ShellCloudProvider

# /home is a tmpfs in the private mount namespace, so the host needs no /home/user.
_BIND = (
    "mount -t tmpfs -o mode=755 fake-home /home && mkdir /home/user && "
    'mount --bind "$1" /home/user && cd /home/user && exec sh -c "$2"'
)


class LocalShellProvider(ShellCloudProvider):
    name = "local-shell"
    workspace = "/home/user"

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root
        self.created: dict[str, datetime] = {}
        self.specs: dict[str, SandboxSpec] = {}
        """What each sandbox was created with (a cloud adapter maps it to its SDK's call)."""

    def _dir(self, provider_id: str) -> Path:
        if provider_id not in self.created:
            raise SandboxGone(f"{provider_id} is gone")
        return self.root / provider_id

    def create(self, spec: SandboxSpec) -> SandboxHandle:
        provider_id = uuid.uuid4().hex
        (self.root / provider_id).mkdir()
        self.created[provider_id] = datetime.now(UTC)
        self.specs[provider_id] = spec
        return self.get(provider_id)

    def get(self, provider_id: str) -> SandboxHandle:
        self._dir(provider_id)
        return SandboxHandle(
            self.name, provider_id, SandboxState.RUNNING, self.created[provider_id]
        )

    def list_sandboxes(self) -> list[SandboxHandle]:
        return [self.get(p) for p in self.created]

    def destroy(self, provider_id: str) -> bool:
        if self.created.pop(provider_id, None) is None:
            return False
        subprocess.run(["rm", "-rf", str(self.root / provider_id)], check=False)
        return True

    def health(self):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def _shell(self, provider_id: str, script: str, timeout_s: float) -> tuple[bytes, int]:
        directory = self._dir(provider_id)
        done = subprocess.run(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                _BIND,
                "sh",
                str(directory),
                script,
            ],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            timeout=timeout_s,
            check=False,
        )
        return done.stdout, done.returncode
