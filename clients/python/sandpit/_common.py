"""Request shapes and parsing shared by the sync and async clients (no I/O here)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any
from urllib.parse import quote

from websockets.exceptions import InvalidStatus

from .errors import SandpitConnectionError, SandpitError, error_from
from .models import CommandResult, FileEvent, ProviderInfo, SandboxInfo, SandboxToken

API = "/api/v1"
CHUNK_BYTES = 64 * 1024
# The server's command ceiling is its own setting; the HTTP wait must outlast the command.
HTTP_MARGIN_S = 30.0

OutputCallback = Callable[[str], Any]
ProgressCallback = Callable[[int, int | None], Any]
"""(bytes done, total bytes or None when unknown)."""


def sandbox_path(sandbox_id: str, tail: str = "") -> str:
    return f"{API}/sandboxes/{quote(sandbox_id, safe='')}{tail}"


def create_body(
    *,
    provider: str | None,
    template: str | None,
    timeout_s: int | None,
    env: Mapping[str, str] | None,
    metadata: Mapping[str, Any] | None,
    resources: Mapping[str, Any] | None,
    network: bool | None,
    snapshot: str | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {}
    for key, value in (
        ("provider", provider),
        ("template", template),
        ("timeout_s", timeout_s),
        ("network", network),
        ("snapshot", snapshot),
    ):
        if value is not None:
            body[key] = value
    if env:
        body["env"] = dict(env)
    if metadata:
        body["metadata"] = dict(metadata)
    if resources:
        body["resources"] = dict(resources)
    return body


def matches(info: SandboxInfo, metadata: Mapping[str, Any] | None) -> bool:
    """Metadata filtering is done here: the list endpoint filters by state only."""
    return not metadata or all(info.metadata.get(k) == v for k, v in metadata.items())


def command_body(
    cmd: str,
    args: list[str] | None,
    cwd: str | None,
    env: Mapping[str, str] | None,
    stdin: str | None,
    timeout_s: float | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"command": cmd}
    if args is not None:
        body["args"] = list(args)
    if cwd is not None:
        body["cwd"] = cwd
    if env:
        body["env"] = dict(env)
    if stdin is not None:
        body["stdin"] = stdin
    if timeout_s is not None:
        body["timeout_s"] = timeout_s
    return body


def run_message(
    *,
    cmd: str | None = None,
    code: str | None = None,
    language: str | None = None,
    args: list[str] | None = None,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
) -> dict[str, Any]:
    message: dict[str, Any] = {"type": "run", "id": "r" + uuid.uuid4().hex[:12]}
    if code is not None:
        message["code"] = code
        if language:
            message["language"] = language
    else:
        message["command"] = cmd
        if args is not None:
            message["args"] = list(args)
    if cwd is not None:
        message["cwd"] = cwd
    if env:
        message["env"] = dict(env)
    if timeout_s is not None:
        message["timeout_s"] = timeout_s
    return message


def ws_error(message: dict[str, Any]) -> SandpitError:
    return error_from(
        str(message.get("code") or "error"),
        str(message.get("message") or "WebSocket error"),
        message.get("status"),
    )


def ws_open_error(exc: InvalidStatus | OSError | TimeoutError, path: str) -> SandpitError:
    """Why a WebSocket did not open: the server's refusal (its HTTP status), or no server."""
    if isinstance(exc, InvalidStatus):
        return error_from("websocket_refused", str(exc), exc.response.status_code)
    return SandpitConnectionError(f"Cannot open {path}: {exc}", code="connection_error")


def ws_close_error(code: int | None, reason: str) -> SandpitError:
    status = {4401: 401, 4402: 402, 4403: 403, 4404: 404}.get(code or 0)
    return error_from("websocket_closed", reason or f"The socket closed ({code}).", status)


class ExecState:
    """Folds exec-socket messages for one run into a CommandResult."""

    def __init__(
        self,
        run_id: str,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
    ) -> None:
        self.run_id = run_id
        self.on_stdout = on_stdout
        self.on_stderr = on_stderr
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.pid: int | None = None
        self.result: CommandResult | None = None
        self.error: SandpitError | None = None

    def feed(self, raw: str | bytes) -> bool:
        """Take one frame; True when the run is over (result or error set)."""
        if isinstance(raw, bytes):
            return False
        message = json.loads(raw)
        if message.get("id") not in (self.run_id, None):
            return False
        kind = message.get("type")
        if kind == "started":
            self.pid = int(message.get("pid") or 0) or None
        elif kind == "stdout":
            self.stdout.append(message["data"])
            if self.on_stdout:
                self.on_stdout(message["data"])
        elif kind == "stderr":
            self.stderr.append(message["data"])
            if self.on_stderr:
                self.on_stderr(message["data"])
        elif kind == "exit":
            code = message.get("code")
            self.result = CommandResult(
                stdout="".join(self.stdout),
                stderr="".join(self.stderr),
                exit_code=int(code) if code is not None else -1,
                duration_ms=float(message.get("duration_ms") or 0),
                timed_out=bool(message.get("timed_out")),
                cancelled=bool(message.get("cancelled")),
                pid=self.pid,
            )
            return True
        elif kind == "error":
            # Errors without an id concern the socket; with ours, this run.
            self.error = ws_error(message)
            return True
        return False


def file_events(message: dict[str, Any]) -> list[FileEvent]:
    return [
        FileEvent(
            type=str(e.get("type")),
            path=str(e.get("path")),
            is_dir=bool(e.get("is_dir")),
            old_path=e.get("old_path"),
        )
        for e in message.get("events") or []
    ]


def token_from(data: dict[str, Any]) -> SandboxToken:
    expires = data.get("expires_at")
    return SandboxToken(
        token=data["token"],
        scopes=tuple(data.get("scopes") or ()),
        expires_at=datetime.fromisoformat(expires) if expires else None,
    )


def providers_from(data: dict[str, Any]) -> list[ProviderInfo]:
    return [
        ProviderInfo(
            name=p["name"],
            default=bool(p.get("default")),
            capabilities=tuple(p.get("capabilities") or ()),
            healthy=bool((p.get("health") or {}).get("ok")),
            limits=dict(p.get("limits") or {}),
        )
        for p in data.get("results") or []
    ]


def preview_url(base: str, sandbox_id: str, port: int, token: str) -> str:
    return f"{base}/sandboxes/{quote(sandbox_id, safe='')}/ports/{int(port)}/?token={quote(token)}"


def file_chunks(data: Any, on_progress: ProgressCallback | None) -> tuple[bytes | Any, int | None]:
    """The PUT body: bytes as they are, or a generator over a file-like object, and its size."""
    if isinstance(data, str):
        data = data.encode()
    if isinstance(data, bytes | bytearray | memoryview):
        body = bytes(data)
        if on_progress:
            on_progress(0, len(body))

            def chunks_of_bytes() -> Any:
                for start in range(0, len(body), CHUNK_BYTES):
                    piece = body[start : start + CHUNK_BYTES]
                    yield piece
                    on_progress(min(start + len(piece), len(body)), len(body))

            return chunks_of_bytes(), len(body)
        return body, len(body)
    total: int | None = None
    try:
        here = data.tell()
        data.seek(0, 2)
        total = data.tell() - here
        data.seek(here)
    except (AttributeError, OSError, ValueError):
        total = None

    def chunks() -> Any:
        done = 0
        while True:
            piece = data.read(CHUNK_BYTES)
            if not piece:
                break
            if isinstance(piece, str):
                piece = piece.encode()
            done += len(piece)
            yield piece
            if on_progress:
                on_progress(done, total)

    return chunks(), total
