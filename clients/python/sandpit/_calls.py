"""Every REST operation of the SDK, once: the request it sends and how its answer is read.

The sync client (client.py) and the async one (aio.py) describe an operation by calling one
of these functions and hand the `Call` to their transport (`HttpClient.call`, awaited on
`AsyncHttpClient`), so paths, bodies, timeouts and parsing cannot drift apart between them.
No I/O here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import httpx

from ._common import API, HTTP_MARGIN_S, command_body, providers_from, sandbox_path, token_from
from .errors import NotFoundError
from .models import (
    BackgroundOutput,
    CommandResult,
    FileEntry,
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

T = TypeVar("T")


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request and the reading of its answer."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    json: Any = None
    params: Mapping[str, Any] | None = None
    timeout_s: float | None = None
    """None: the client's default."""
    content: Any = None
    headers: Mapping[str, str] | None = field(default=None)
    missing: Callable[[NotFoundError], T] | None = None
    """What a 404 answers instead of raising (the object was already gone); None: raise."""


def _none(response: httpx.Response) -> None:
    return None


def _one(from_json: Callable[[dict[str, Any]], T]) -> Callable[[httpx.Response], T]:
    return lambda response: from_json(response.json())


def _many(
    from_json: Callable[[dict[str, Any]], T], key: str = "results"
) -> Callable[[httpx.Response], list[T]]:
    return lambda response: [from_json(item) for item in response.json().get(key) or []]


_sandbox = _one(SandboxInfo.from_json)
_file = _one(FileEntry.from_json)
_process = _one(ProcessInfo.from_json)
_command_result = _one(CommandResult.from_json)
_snapshot = _one(SnapshotInfo.from_json)
_snapshots = _many(SnapshotInfo.from_json)


def _false(exc: NotFoundError) -> bool:
    return False


def _false_unless_sandbox_gone(exc: NotFoundError) -> bool:
    """A process or terminal already gone is False; a sandbox that is gone still raises."""
    if exc.code == "sandbox_not_found":
        raise exc
    return False


def _true(response: httpx.Response) -> bool:
    return True


def _recursive(value: bool) -> str:
    return "true" if value else "false"


# --- organization-wide ---------------------------------------------------------------------


def sandbox_create(body: dict[str, Any]) -> Call[SandboxInfo]:
    return Call("POST", f"{API}/sandboxes", _sandbox, json=body)


def sandbox_info(sandbox_id: str) -> Call[SandboxInfo]:
    return Call("GET", sandbox_path(sandbox_id), _sandbox)


def sandboxes_first_params(state: str | None, include_destroyed: bool) -> dict[str, Any]:
    """The query of the list's first page (`sandboxes_page` pages on with its offset)."""
    params: dict[str, Any] = {"limit": 100, "offset": 0}
    if state:
        params["state"] = state
    if include_destroyed:
        params["all"] = "true"
    return params


def sandboxes_page(params: Mapping[str, Any]) -> Call[tuple[list[SandboxInfo], bool]]:
    """One page of the organization's sandboxes and whether another follows."""

    def parse(response: httpx.Response) -> tuple[list[SandboxInfo], bool]:
        page = response.json()
        results = [SandboxInfo.from_json(item) for item in page.get("results") or []]
        return results, bool(page.get("next")) and bool(results)

    return Call("GET", f"{API}/sandboxes", parse, params=dict(params))


def run(
    *,
    code: str | None,
    command: str | None,
    language: str | None,
    files: Mapping[str, str] | None,
    stdin: str | None,
    limits: Mapping[str, float] | None,
    provider: str | None,
) -> Call[RunResult]:
    body: dict[str, Any] = {}
    for key, value in (
        ("code", code),
        ("command", command),
        ("language", language),
        ("stdin", stdin),
        ("provider", provider),
    ):
        if value is not None:
            body[key] = value
    if files:
        body["files"] = dict(files)
    if limits:
        body["limits"] = dict(limits)
    wait = float((limits or {}).get("timeout_s", 60)) + HTTP_MARGIN_S
    return Call("POST", f"{API}/run", _one(RunResult.from_json), json=body, timeout_s=wait)


def providers() -> Call[list[ProviderInfo]]:
    return Call("GET", f"{API}/providers", _one(providers_from))


def snapshots() -> Call[list[SnapshotInfo]]:
    return Call("GET", f"{API}/snapshots", _snapshots)


def snapshot_info(snapshot_id: str) -> Call[SnapshotInfo]:
    return Call("GET", f"{API}/snapshots/{snapshot_id}", _snapshot)


def snapshot_delete(snapshot_id: str) -> Call[bool]:
    return Call("DELETE", f"{API}/snapshots/{snapshot_id}", _true, missing=_false)


# --- one sandbox ------------------------------------------------------------------------------


def sandbox_destroy(sandbox_id: str) -> Call[SandboxInfo]:
    return Call("DELETE", sandbox_path(sandbox_id), _sandbox)


def sandbox_set_timeout(sandbox_id: str, timeout_s: int) -> Call[SandboxInfo]:
    return Call(
        "POST", sandbox_path(sandbox_id, "/timeout"), _sandbox, json={"timeout_s": timeout_s}
    )


def sandbox_stats(sandbox_id: str) -> Call[SandboxStats]:
    return Call("GET", sandbox_path(sandbox_id, "/stats"), _one(SandboxStats.from_json))


def sandbox_token(sandbox_id: str, scopes: list[str], ttl_s: int) -> Call[SandboxToken]:
    return Call(
        "POST",
        sandbox_path(sandbox_id, "/tokens"),
        _one(token_from),
        json={"scopes": scopes, "ttl_s": ttl_s},
    )


def sandbox_pause(sandbox_id: str) -> Call[SandboxInfo]:
    return Call("POST", sandbox_path(sandbox_id, "/pause"), _sandbox)


def sandbox_resume(sandbox_id: str) -> Call[SandboxInfo]:
    return Call("POST", sandbox_path(sandbox_id, "/resume"), _sandbox)


def sandbox_snapshot(sandbox_id: str, name: str) -> Call[SnapshotInfo]:
    return Call("POST", sandbox_path(sandbox_id, "/snapshots"), _snapshot, json={"name": name})


def sandbox_snapshots(sandbox_id: str) -> Call[list[SnapshotInfo]]:
    return Call("GET", sandbox_path(sandbox_id, "/snapshots"), _snapshots)


def sandbox_fork(sandbox_id: str) -> Call[SandboxInfo]:
    return Call("POST", sandbox_path(sandbox_id, "/fork"), _sandbox)


def sandbox_languages(sandbox_id: str) -> Call[list[Language]]:
    return Call("GET", sandbox_path(sandbox_id, "/languages"), _many(Language.from_json))


def code_run(
    sandbox_id: str,
    code: str,
    *,
    language: str | None,
    stdin: str | None,
    timeout_s: float | None,
    compile_timeout_s: float | None,
) -> Call[CommandResult]:
    body: dict[str, Any] = {"code": code, "encoding": "base64"}
    if language:
        body["language"] = language
    if stdin is not None:
        body["stdin"] = stdin
    if timeout_s is not None:
        body["timeout_s"] = timeout_s
    if compile_timeout_s is not None:
        body["compile_timeout_s"] = compile_timeout_s
    wait = (timeout_s or 300) + (compile_timeout_s or 30) + HTTP_MARGIN_S
    return Call(
        "POST", sandbox_path(sandbox_id, "/code"), _command_result, json=body, timeout_s=wait
    )


# --- commands and processes ---------------------------------------------------------------------


def command_run(
    sandbox_id: str,
    cmd: str,
    args: list[str] | None,
    cwd: str | None,
    env: Mapping[str, str] | None,
    stdin: str | None,
    timeout_s: float | None,
) -> Call[CommandResult]:
    # base64: the exact bytes come back (CommandResult.stdout_bytes), text is decoded here.
    body = {**command_body(cmd, args, cwd, env, stdin, timeout_s), "encoding": "base64"}
    wait = (timeout_s or 300) + HTTP_MARGIN_S
    return Call(
        "POST", sandbox_path(sandbox_id, "/commands"), _command_result, json=body, timeout_s=wait
    )


def command_start(
    sandbox_id: str,
    cmd: str,
    args: list[str] | None,
    cwd: str | None,
    env: Mapping[str, str] | None,
) -> Call[ProcessInfo]:
    body = {**command_body(cmd, args, cwd, env, None, None), "background": True}
    return Call("POST", sandbox_path(sandbox_id, "/commands"), _process, json=body)


def command_output(
    sandbox_id: str, pid: int, stdout_offset: int, stderr_offset: int
) -> Call[BackgroundOutput]:
    params = {"stdout_offset": stdout_offset, "stderr_offset": stderr_offset, "encoding": "base64"}
    return Call(
        "GET",
        sandbox_path(sandbox_id, f"/processes/{int(pid)}/output"),
        _one(BackgroundOutput.from_json),
        params=params,
    )


def process_list(sandbox_id: str) -> Call[list[ProcessInfo]]:
    return Call("GET", sandbox_path(sandbox_id, "/processes"), _many(ProcessInfo.from_json))


def process_start(
    sandbox_id: str,
    cmd: str,
    args: list[str] | None,
    cwd: str | None,
    env: Mapping[str, str] | None,
) -> Call[ProcessInfo]:
    body = command_body(cmd, args, cwd, env, None, None)
    return Call("POST", sandbox_path(sandbox_id, "/processes"), _process, json=body)


def process_signal(sandbox_id: str, pid: int, signal: str) -> Call[None]:
    return Call(
        "POST",
        sandbox_path(sandbox_id, f"/processes/{int(pid)}/signal"),
        _none,
        json={"signal": signal},
    )


def process_kill(sandbox_id: str, pid: int) -> Call[bool]:
    """SIGKILL; False when there is no such process (already gone)."""
    return Call(
        "POST",
        sandbox_path(sandbox_id, f"/processes/{int(pid)}/signal"),
        _true,
        json={"signal": "SIGKILL"},
        missing=_false_unless_sandbox_gone,
    )


# --- files ------------------------------------------------------------------------------------


def file_content(sandbox_id: str, path: str) -> Call[bytes]:
    return Call(
        "GET",
        sandbox_path(sandbox_id, "/files/content"),
        lambda response: bytes(response.content),
        params={"path": path},
    )


def file_write(sandbox_id: str, path: str, body: Any, total: int | None) -> Call[FileEntry]:
    """`body` and `total` from `file_chunks` (an async client passes its chunks async)."""
    headers = {"Content-Type": "application/octet-stream"}
    if total is not None and not isinstance(body, bytes):
        headers["Content-Length"] = str(total)
    return Call(
        "PUT",
        sandbox_path(sandbox_id, "/files/content"),
        _file,
        params={"path": path},
        content=body,
        headers=headers,
    )


def file_list(sandbox_id: str, path: str, recursive: bool) -> Call[list[FileEntry]]:
    return Call(
        "GET",
        sandbox_path(sandbox_id, "/files"),
        _many(FileEntry.from_json, "entries"),
        params={"path": path, "recursive": _recursive(recursive)},
    )


def file_stat(sandbox_id: str, path: str) -> Call[FileEntry]:
    return Call("GET", sandbox_path(sandbox_id, "/files/stat"), _file, params={"path": path})


def file_exists(sandbox_id: str, path: str) -> Call[bool]:
    return Call(
        "GET",
        sandbox_path(sandbox_id, "/files/exists"),
        lambda response: bool(response.json()["exists"]),
        params={"path": path},
    )


def file_remove(sandbox_id: str, path: str, recursive: bool) -> Call[None]:
    return Call(
        "DELETE",
        sandbox_path(sandbox_id, "/files"),
        _none,
        params={"path": path, "recursive": _recursive(recursive)},
    )


def file_move(sandbox_id: str, src: str, dst: str) -> Call[FileEntry]:
    return Call(
        "POST", sandbox_path(sandbox_id, "/files/move"), _file, json={"from": src, "to": dst}
    )


def file_mkdir(sandbox_id: str, path: str) -> Call[FileEntry]:
    return Call("POST", sandbox_path(sandbox_id, "/files/mkdir"), _file, json={"path": path})


# --- terminals --------------------------------------------------------------------------------


def terminal_create(
    sandbox_id: str,
    cols: int,
    rows: int,
    shell: str | None,
    cwd: str | None,
    env: Mapping[str, str] | None,
) -> Call[TerminalInfo]:
    body: dict[str, Any] = {"cols": cols, "rows": rows}
    if shell:
        body["shell"] = shell
    if cwd:
        body["cwd"] = cwd
    if env:
        body["env"] = dict(env)
    return Call(
        "POST", sandbox_path(sandbox_id, "/terminals"), _one(TerminalInfo.from_json), json=body
    )


def terminal_list(sandbox_id: str) -> Call[list[TerminalInfo]]:
    return Call("GET", sandbox_path(sandbox_id, "/terminals"), _many(TerminalInfo.from_json))


def terminal_resize(sandbox_id: str, terminal_id: str, cols: int, rows: int) -> Call[None]:
    return Call(
        "POST",
        sandbox_path(sandbox_id, f"/terminals/{terminal_id}/resize"),
        _none,
        json={"cols": cols, "rows": rows},
    )


def terminal_kill(sandbox_id: str, terminal_id: str) -> Call[bool]:
    """End the shell and its processes; False when it was already gone."""
    return Call(
        "DELETE",
        sandbox_path(sandbox_id, f"/terminals/{terminal_id}"),
        _true,
        missing=_false_unless_sandbox_gone,
    )
