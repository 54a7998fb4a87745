"""The asynchronous client: the same surface as `sandpit.client`, every call awaitable.

Each REST operation is described once in _calls.py (shared with the sync client) and sent
here with `await self.http.call(...)`; the sockets are in _async_realtime.py.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from . import _calls as calls
from . import _common as c
from ._async_realtime import AsyncCommandHandle, AsyncTerminal, AsyncWatcher, open_socket
from ._http import AsyncHttpClient, RetryPolicy
from .config import Config, resolve_config
from .errors import NotFoundError
from .models import (
    BackgroundOutput,
    CommandResult,
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

__all__ = [
    "AsyncCommandHandle",
    "AsyncCommands",
    "AsyncFiles",
    "AsyncProcesses",
    "AsyncSandbox",
    "AsyncSandpit",
    "AsyncTerminal",
    "AsyncTerminals",
    "AsyncWatcher",
]


class AsyncSandpit:
    """Like `Sandpit`, with coroutines."""

    def __init__(
        self,
        api_key: str | None = None,
        url: str | None = None,
        *,
        timeout_s: float = 60.0,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.config: Config = resolve_config(url, api_key)
        self.http = AsyncHttpClient(self.config, timeout_s=timeout_s, retry=retry)

    async def create(
        self,
        *,
        provider: str | None = None,
        template: str | None = None,
        timeout_s: int | None = None,
        env: Mapping[str, str] | None = None,
        metadata: Mapping[str, Any] | None = None,
        resources: Mapping[str, Any] | None = None,
        network: bool | None = None,
        snapshot: str | None = None,
    ) -> AsyncSandbox:
        body = c.create_body(
            provider=provider,
            template=template,
            timeout_s=timeout_s,
            env=env,
            metadata=metadata,
            resources=resources,
            network=network,
            snapshot=snapshot,
        )
        return AsyncSandbox(self, await self.http.call(calls.sandbox_create(body)))

    async def connect(self, sandbox_id: str) -> AsyncSandbox:
        return AsyncSandbox(self, await self.sandbox_info(sandbox_id))

    async def sandbox_info(self, sandbox_id: str) -> SandboxInfo:
        return await self.http.call(calls.sandbox_info(sandbox_id))

    async def list(
        self,
        *,
        state: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        include_destroyed: bool = False,
    ) -> list[SandboxInfo]:
        params = calls.sandboxes_first_params(state, include_destroyed)
        found: list[SandboxInfo] = []
        more = True
        while more:
            page, more = await self.http.call(calls.sandboxes_page(params))
            found.extend(page)
            params["offset"] += len(page)
        return [info for info in found if c.matches(info, metadata)]

    async def run(
        self,
        *,
        code: str | None = None,
        command: str | None = None,
        language: str | None = None,
        files: Mapping[str, str] | None = None,
        stdin: str | None = None,
        limits: Mapping[str, float] | None = None,
        provider: str | None = None,
    ) -> RunResult:
        return await self.http.call(
            calls.run(
                code=code,
                command=command,
                language=language,
                files=files,
                stdin=stdin,
                limits=limits,
                provider=provider,
            )
        )

    async def providers(self) -> list[ProviderInfo]:
        return await self.http.call(calls.providers())

    async def snapshots(self) -> list[SnapshotInfo]:
        """Your organization's snapshots, newest first (first page)."""
        return await self.http.call(calls.snapshots())

    async def snapshot_info(self, snapshot_id: str) -> SnapshotInfo:
        return await self.http.call(calls.snapshot_info(snapshot_id))

    async def delete_snapshot(self, snapshot_id: str) -> bool:
        """Delete a snapshot and its archive; False when it was not found."""
        return await self.http.call(calls.snapshot_delete(snapshot_id))

    async def close(self) -> None:
        await self.http.close()

    async def __aenter__(self) -> AsyncSandpit:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncSandbox:
    """One sandbox. `async with await AsyncSandbox.create() as sbx:` destroys it on exit."""

    def __init__(self, client: AsyncSandpit, info: SandboxInfo, *, owns_client: bool = False):
        self.client = client
        self.id = info.id
        self._info = info
        self._owns_client = owns_client
        self.commands = AsyncCommands(self)
        self.files = AsyncFiles(self)
        self.processes = AsyncProcesses(self)
        self.terminals = AsyncTerminals(self)

    @classmethod
    async def create(
        cls,
        *,
        provider: str | None = None,
        template: str | None = None,
        timeout_s: int | None = None,
        env: Mapping[str, str] | None = None,
        metadata: Mapping[str, Any] | None = None,
        resources: Mapping[str, Any] | None = None,
        network: bool | None = None,
        api_key: str | None = None,
        url: str | None = None,
        client: AsyncSandpit | None = None,
    ) -> AsyncSandbox:
        owner = client is None
        client = client or AsyncSandpit(api_key, url)
        try:
            sandbox = await client.create(
                provider=provider,
                template=template,
                timeout_s=timeout_s,
                env=env,
                metadata=metadata,
                resources=resources,
                network=network,
            )
        except BaseException:
            if owner:
                await client.close()
            raise
        sandbox._owns_client = owner
        return sandbox

    @classmethod
    async def connect(
        cls,
        sandbox_id: str,
        *,
        api_key: str | None = None,
        url: str | None = None,
        client: AsyncSandpit | None = None,
    ) -> AsyncSandbox:
        owner = client is None
        client = client or AsyncSandpit(api_key, url)
        try:
            sandbox = await client.connect(sandbox_id)
        except BaseException:
            if owner:
                await client.close()
            raise
        sandbox._owns_client = owner
        return sandbox

    @classmethod
    async def list(
        cls,
        *,
        metadata: Mapping[str, Any] | None = None,
        state: str | None = None,
        api_key: str | None = None,
        url: str | None = None,
        client: AsyncSandpit | None = None,
    ) -> list[SandboxInfo]:
        if client is not None:
            return await client.list(metadata=metadata, state=state)
        async with AsyncSandpit(api_key, url) as own:
            return await own.list(metadata=metadata, state=state)

    def path(self, tail: str = "") -> str:
        return c.sandbox_path(self.id, tail)

    async def _request(self, method: str, tail: str, **kwargs: Any) -> Any:
        return await self.client.http.request(method, self.path(tail), **kwargs)

    async def info(self) -> SandboxInfo:
        self._info = await self.client.sandbox_info(self.id)
        return self._info

    async def is_running(self) -> bool:
        return (await self.info()).state == "running"

    async def kill(self) -> bool:
        """Destroy the sandbox. False when it was already destroyed or is not found."""
        try:
            if (await self.client.sandbox_info(self.id)).state == "destroyed":
                return False
            self._info = await self.client.http.call(calls.sandbox_destroy(self.id))
        except NotFoundError:
            return False
        return True

    async def set_timeout(self, timeout_s: int) -> SandboxInfo:
        self._info = await self.client.http.call(calls.sandbox_set_timeout(self.id, timeout_s))
        return self._info

    async def stats(self) -> SandboxStats:
        return await self.client.http.call(calls.sandbox_stats(self.id))

    async def create_token(self, scopes: list[str], *, ttl_s: int = 900) -> SandboxToken:
        return await self.client.http.call(calls.sandbox_token(self.id, scopes, ttl_s))

    async def get_url(self, port: int, *, ttl_s: int = 900) -> str:
        token = await self.create_token(["ports"], ttl_s=ttl_s)
        return c.preview_url(self.client.config.url, self.id, port, token.token)

    async def pause(self) -> SandboxInfo:
        """Freeze every process, memory kept (see Sandbox.pause)."""
        self._info = await self.client.http.call(calls.sandbox_pause(self.id))
        return self._info

    async def resume(self) -> SandboxInfo:
        """Thaw a paused sandbox, or start an archived one again (see Sandbox.resume)."""
        self._info = await self.client.http.call(calls.sandbox_resume(self.id))
        return self._info

    async def snapshot(self, name: str = "") -> SnapshotInfo:
        """Save /workspace and /tmp as a snapshot."""
        return await self.client.http.call(calls.sandbox_snapshot(self.id, name))

    async def snapshots(self) -> list[SnapshotInfo]:
        """This sandbox's snapshots, newest first (first page)."""
        return await self.client.http.call(calls.sandbox_snapshots(self.id))

    async def fork(self) -> AsyncSandbox:
        """A new sandbox with a copy of this one's files, on the same client."""
        return AsyncSandbox(self.client, await self.client.http.call(calls.sandbox_fork(self.id)))

    async def languages(self) -> list[Language]:
        """The languages this sandbox runs (its template's): what run_code's `language` takes."""
        return await self.client.http.call(calls.sandbox_languages(self.id))

    async def run_code(
        self,
        code: str,
        *,
        language: str | None = None,
        stdin: str | None = None,
        timeout_s: float | None = None,
        compile_timeout_s: float | None = None,
        on_stdout: c.OutputCallback | None = None,
        on_stderr: c.OutputCallback | None = None,
    ) -> CommandResult:
        """See Sandbox.run_code."""
        if on_stdout or on_stderr:
            message = c.run_message(code=code, language=language, timeout_s=timeout_s)
            handle = await self.commands._stream(message, stdin, on_stdout, on_stderr, False)
            return await handle.wait()
        call = calls.code_run(
            self.id,
            code,
            language=language,
            stdin=stdin,
            timeout_s=timeout_s,
            compile_timeout_s=compile_timeout_s,
        )
        return await self.client.http.call(call)

    async def close(self) -> None:
        if self._owns_client:
            await self.client.close()

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.kill()
        finally:
            await self.close()


class AsyncCommands:
    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    async def run(
        self,
        cmd: str,
        args: list[str] | None = None,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | None = None,
        timeout_s: float | None = None,
        background: bool = False,
        on_stdout: c.OutputCallback | None = None,
        on_stderr: c.OutputCallback | None = None,
    ) -> Any:
        """Like `Commands.run`: a CommandResult, or an AsyncCommandHandle with `background`."""
        if background or on_stdout or on_stderr:
            message = c.run_message(cmd=cmd, args=args, cwd=cwd, env=env, timeout_s=timeout_s)
            handle = await self._stream(message, stdin, on_stdout, on_stderr, background)
            return handle if background else await handle.wait()
        call = calls.command_run(self._sandbox.id, cmd, args, cwd, env, stdin, timeout_s)
        return await self._sandbox.client.http.call(call)

    async def start(
        self,
        cmd: str,
        args: list[str] | None = None,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ProcessInfo:
        """Start `cmd` detached (it outlives this client) and return at once; read what it
        writes with `output(pid)`, stop it with `sandbox.processes.kill(pid)`."""
        call = calls.command_start(self._sandbox.id, cmd, args, cwd, env)
        return await self._sandbox.client.http.call(call)

    async def output(
        self, pid: int, *, stdout_offset: int = 0, stderr_offset: int = 0
    ) -> BackgroundOutput:
        """What a command from `start()` wrote after the given byte offsets (pass back the
        previous answer's offsets to read only what is new), and whether it still runs."""
        call = calls.command_output(self._sandbox.id, pid, stdout_offset, stderr_offset)
        return await self._sandbox.client.http.call(call)

    async def _stream(
        self,
        message: dict[str, Any],
        stdin: str | None,
        on_stdout: c.OutputCallback | None,
        on_stderr: c.OutputCallback | None,
        keep_stdin_open: bool,
    ) -> AsyncCommandHandle:
        ws = await open_socket(self._sandbox.client.http, f"/ws/sandboxes/{self._sandbox.id}/exec")
        await ws.send(json.dumps(message))
        run_id = message["id"]
        if stdin is not None:
            await ws.send(json.dumps({"type": "stdin", "id": run_id, "data": stdin, "eof": True}))
        elif not keep_stdin_open:
            await ws.send(json.dumps({"type": "stdin_close", "id": run_id}))
        return AsyncCommandHandle(ws, message, c.ExecState(run_id, on_stdout, on_stderr))


class AsyncFiles:
    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    async def read(self, path: str, format: str = "bytes") -> Any:  # noqa: A002
        """bytes, str ("text"), or an async iterator of chunks ("stream")."""
        if format == "stream":
            response = await self._sandbox._request(
                "GET", "/files/content", params={"path": path}, stream=True
            )

            async def chunks() -> AsyncIterator[bytes]:
                try:
                    async for piece in response.aiter_bytes(c.CHUNK_BYTES):
                        yield piece
                finally:
                    await response.aclose()

            return chunks()
        if format not in ("bytes", "text"):
            raise ValueError("format is 'bytes', 'text' or 'stream'")
        data = await self._sandbox.client.http.call(calls.file_content(self._sandbox.id, path))
        return data.decode() if format == "text" else data

    async def write(
        self, path: str, data: Any, *, on_progress: c.ProgressCallback | None = None
    ) -> FileEntry:
        body, total = c.file_chunks(data, on_progress)
        if not isinstance(body, bytes):
            chunks = body

            async def agen() -> AsyncIterator[bytes]:
                for piece in chunks:
                    yield piece

            body = agen()
        call = calls.file_write(self._sandbox.id, path, body, total)
        return await self._sandbox.client.http.call(call)

    async def list(self, path: str = ".", *, recursive: bool = False) -> list[FileEntry]:
        return await self._sandbox.client.http.call(
            calls.file_list(self._sandbox.id, path, recursive)
        )

    async def stat(self, path: str) -> FileEntry:
        return await self._sandbox.client.http.call(calls.file_stat(self._sandbox.id, path))

    async def exists(self, path: str) -> bool:
        """Whether anything is at `path` (a dangling symlink counts)."""
        return await self._sandbox.client.http.call(calls.file_exists(self._sandbox.id, path))

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        await self._sandbox.client.http.call(calls.file_remove(self._sandbox.id, path, recursive))

    async def rename(self, src: str, dst: str) -> FileEntry:
        return await self._sandbox.client.http.call(calls.file_move(self._sandbox.id, src, dst))

    async def make_dir(self, path: str) -> FileEntry:
        return await self._sandbox.client.http.call(calls.file_mkdir(self._sandbox.id, path))

    async def watch(
        self,
        path: str = ".",
        *,
        on_event: Callable[[FileEvent], Any],
        recursive: bool = True,
        ignore: list[str] | None = None,
        debounce_ms: int = 100,
    ) -> AsyncWatcher:
        ws = await open_socket(
            self._sandbox.client.http, f"/ws/sandboxes/{self._sandbox.id}/events"
        )
        watcher = AsyncWatcher(ws, on_event)
        await watcher._start(path, recursive, ignore, debounce_ms)
        return watcher


class AsyncProcesses:
    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    async def list(self) -> list[ProcessInfo]:
        return await self._sandbox.client.http.call(calls.process_list(self._sandbox.id))

    async def start(
        self,
        cmd: str,
        args: list[str] | None = None,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ProcessInfo:
        call = calls.process_start(self._sandbox.id, cmd, args, cwd, env)
        return await self._sandbox.client.http.call(call)

    async def signal(self, pid: int, signal: str = "SIGTERM") -> None:
        await self._sandbox.client.http.call(calls.process_signal(self._sandbox.id, pid, signal))

    async def kill(self, pid: int) -> bool:
        return await self._sandbox.client.http.call(calls.process_kill(self._sandbox.id, pid))


class AsyncTerminals:
    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    async def create(
        self,
        cols: int = 80,
        rows: int = 24,
        *,
        shell: str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        on_data: Callable[[bytes], Any] | None = None,
    ) -> AsyncTerminal:
        call = calls.terminal_create(self._sandbox.id, cols, rows, shell, cwd, env)
        info: TerminalInfo = await self._sandbox.client.http.call(call)
        return await self.attach(info.id, on_data=on_data)

    async def attach(
        self, terminal_id: str, *, on_data: Callable[[bytes], Any] | None = None
    ) -> AsyncTerminal:
        ws = await open_socket(
            self._sandbox.client.http, f"/ws/sandboxes/{self._sandbox.id}/terminals/{terminal_id}"
        )
        return AsyncTerminal(ws, terminal_id, on_data, lambda: self.kill(terminal_id))

    async def list(self) -> list[TerminalInfo]:
        return await self._sandbox.client.http.call(calls.terminal_list(self._sandbox.id))

    async def resize(self, terminal_id: str, cols: int, rows: int) -> None:
        await self._sandbox.client.http.call(
            calls.terminal_resize(self._sandbox.id, terminal_id, cols, rows)
        )

    async def kill(self, terminal_id: str) -> bool:
        return await self._sandbox.client.http.call(
            calls.terminal_kill(self._sandbox.id, terminal_id)
        )
