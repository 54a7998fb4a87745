"""Sandpit's Python SDK: sandboxes, commands, files, processes, terminals and previews.

from sandpit import Sandbox
with Sandbox.create() as sbx:
    print(sbx.commands.run("echo hi").stdout)
"""

from __future__ import annotations

from ._http import RetryPolicy
from ._sync_realtime import CommandHandle, Terminal, Watcher
from .aio import AsyncSandbox, AsyncSandpit
from .client import Sandbox, Sandpit
from .errors import (
    AuthError,
    InvalidRequestError,
    LimitError,
    NotFoundError,
    PaymentRequiredError,
    RateLimitError,
    RequestTimeoutError,
    SandboxError,
    SandpitConnectionError,
    SandpitError,
)
from .models import (
    BackgroundOutput,
    CommandResult,
    CompileStep,
    FileEntry,
    FileEvent,
    Language,
    ProcessInfo,
    ProviderInfo,
    RunResult,
    SandboxInfo,
    SandboxStats,
    SandboxToken,
    SnapshotInfo,
    TerminalInfo,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncSandbox",
    "AsyncSandpit",
    "AuthError",
    "BackgroundOutput",
    "CommandHandle",
    "CommandResult",
    "CompileStep",
    "FileEntry",
    "FileEvent",
    "InvalidRequestError",
    "Language",
    "LimitError",
    "NotFoundError",
    "PaymentRequiredError",
    "ProcessInfo",
    "ProviderInfo",
    "RateLimitError",
    "RequestTimeoutError",
    "RetryPolicy",
    "RunResult",
    "Sandbox",
    "SandboxError",
    "SandboxInfo",
    "SnapshotInfo",
    "SandboxStats",
    "SandboxToken",
    "Sandpit",
    "SandpitConnectionError",
    "SandpitError",
    "Terminal",
    "TerminalInfo",
    "Watcher",
]
