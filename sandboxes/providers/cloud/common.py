"""Helpers every cloud adapter shares: workspace path rules, credentials, shell quoting.

Path rules are the same as the local and docker providers: a relative path is under
the workspace; an absolute one must start with Sandpit's `/workspace` (or the
provider's own workspace directory); anything that normalises outside it, holds a
NUL byte or is longer than 4096 bytes raises PathNotAllowed. These checks are
lexical; adapters that can run a command add a `realpath` check for symlinks.
"""

from __future__ import annotations

import posixpath
import shlex
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import import_module
from types import ModuleType

from sandboxes.providers.base import (
    CapabilityNotSupported,
    ExecRequest,
    InvalidRequest,
    PathNotAllowed,
    ProviderNotConfigured,
)

SANDPIT_WORKSPACE = "/workspace"
MAX_PATH_BYTES = 4096

# Go's os.ProcessState.String() names signals this way ("signal: terminated"); cloud
# agents written in Go (e2b's envd, daytona's toolbox) report a signal death as exit
# code -1 plus that text, so adapters turn it back into our "-N" convention.
_GO_SIGNAL_NAMES = {
    "hangup": signal.SIGHUP,
    "interrupt": signal.SIGINT,
    "quit": signal.SIGQUIT,
    "illegal instruction": signal.SIGILL,
    "trace/breakpoint trap": signal.SIGTRAP,
    "aborted": signal.SIGABRT,
    "bus error": signal.SIGBUS,
    "floating point exception": signal.SIGFPE,
    "killed": signal.SIGKILL,
    "user defined signal 1": signal.SIGUSR1,
    "segmentation fault": signal.SIGSEGV,
    "user defined signal 2": signal.SIGUSR2,
    "broken pipe": signal.SIGPIPE,
    "alarm clock": signal.SIGALRM,
    "terminated": signal.SIGTERM,
}


def exit_code_from(code: int, error: str | None) -> int:
    """Our exit-code convention (negative N = killed by signal N) from a Go-style report."""
    if code == -1 and error and error.startswith("signal: "):
        sig = _GO_SIGNAL_NAMES.get(error.removeprefix("signal: ").strip())
        if sig is not None:
            return -int(sig)
    return code


@dataclass(frozen=True)
class CloudConfig:
    """What the registry builds a cloud adapter from (adapters never read the environment)."""

    installation: str = "default"
    """The label scoping the sandboxes this installation owns."""
    values: Mapping[str, str] = field(default_factory=dict)
    """The adapter's settings by their variable name (E2B_API_KEY, DAYTONA_API_URL...);
    '' or missing when unset."""

    def get(self, name: str, default: str = "") -> str:
        """The setting `name`, or `default` when it is unset or empty."""
        return self.values.get(name) or default

    def require(self, variables: Sequence[str], provider: str) -> dict[str, str]:
        """The named settings; ProviderNotConfigured naming the missing ones."""
        missing = [name for name in variables if not self.get(name)]
        if missing:
            raise ProviderNotConfigured(
                f"The {provider} provider needs the {' and '.join(missing)} environment "
                f"variable{'s' if len(missing) > 1 else ''}."
            )
        return {name: self.values[name] for name in variables}


def import_sdk(module: str, extra: str, provider: str) -> ModuleType:
    """Import an optional SDK, or explain which extra to install."""
    try:
        return import_module(module)
    except ImportError as exc:
        raise ProviderNotConfigured(
            f"The {provider} provider needs its SDK: pip install 'sandpit[{extra}]' "
            f"(module '{module}' is not installed)."
        ) from exc


def not_supported(provider: str, operation: str) -> CapabilityNotSupported:
    return CapabilityNotSupported(f"The '{provider}' provider does not support {operation}.")


def command_line(request: ExecRequest) -> str:
    """A shell string: `command` as is, or the argv form quoted so no shell expands it."""
    if request.args is None:
        return request.command
    return shlex.join([request.command, *request.args])


def check_env(env: Mapping[str, str]) -> dict[str, str]:
    for key, value in env.items():
        if not key or "=" in key or "\x00" in key or "\x00" in value:
            raise InvalidRequest(f"Invalid environment variable name or value: {key!r}")
    return dict(env)


class WorkspacePaths:
    """Maps Sandpit paths onto a provider's workspace directory, lexically."""

    def __init__(self, root: str) -> None:
        self.root = posixpath.normpath(root)

    def inside(self, absolute: str) -> bool:
        return absolute == self.root or absolute.startswith(self.root.rstrip("/") + "/")

    def resolve(self, path: str) -> str:
        """The absolute path in the provider; PathNotAllowed outside the workspace."""
        if not isinstance(path, str) or "\x00" in path or len(path.encode()) > MAX_PATH_BYTES:
            raise PathNotAllowed("The path is malformed (NUL byte or longer than 4096 bytes).")
        rest = path
        if path.startswith("/"):
            for alias in (SANDPIT_WORKSPACE, self.root):
                if path == alias or path.startswith(alias.rstrip("/") + "/"):
                    rest = path[len(alias) :]
                    break
            else:
                raise PathNotAllowed(f"'{path}' is outside the workspace.")
        full = posixpath.normpath(f"{self.root}/{rest}")
        if not self.inside(full):
            raise PathNotAllowed(f"'{path}' is outside the workspace.")
        return full

    def relative(self, absolute: str) -> str:
        """Workspace-relative, '/'-separated, no leading slash ('' for the root)."""
        rel = posixpath.relpath(posixpath.normpath(absolute), self.root)
        return "" if rel == "." else rel

    def cwd(self, cwd: str | None) -> str:
        return self.root if not cwd else self.resolve(cwd)
