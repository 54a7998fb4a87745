"""The asynchronous client: the same surface as `sandpit.client`, every call awaitable."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from . import _common as c
from ._http import AsyncHttpClient, RetryPolicy
from .config import Config, resolve_config
from .errors import (
    NotFoundError,
    RequestTimeoutError,
    SandpitConnectionError,
    SandpitError,
    error_from,
)
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


async def _open(http: AsyncHttpClient, path: str) -> ClientConnection:
    try:
        return await connect(
            http.ws_base + path,
            additional_headers={"Authorization": f"Bearer {http.config.api_key}"},
            open_timeout=30,
            max_size=None,
        )
    except InvalidStatus as exc:
        raise error_from("websocket_refused", str(exc), exc.response.status_code) from None
    except (OSError, TimeoutError) as exc:
        raise SandpitConnectionError(
            f"Cannot open {path}: {exc}", code="connection_error"
        ) from None


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
        response = await self.http.request("POST", f"{c.API}/sandboxes", json=body)
        return AsyncSandbox(self, SandboxInfo.from_json(response.json()))

    async def connect(self, sandbox_id: str) -> AsyncSandbox:
        return AsyncSandbox(self, await self.sandbox_info(sandbox_id))

    async def sandbox_info(self, sandbox_id: str) -> SandboxInfo:
        response = await self.http.request("GET", c.sandbox_path(sandbox_id))
        return SandboxInfo.from_json(response.json())

    async def list(
        self,
        *,
        state: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        include_destroyed: bool = False,
    ) -> list[SandboxInfo]:
        params: dict[str, Any] = {"limit": 100, "offset": 0}
        if state:
            params["state"] = state
        if include_destroyed:
            params["all"] = "true"
        found: list[SandboxInfo] = []
        while True:
            page = (await self.http.request("GET", f"{c.API}/sandboxes", params=params)).json()
            results = page.get("results") or []
            found.extend(SandboxInfo.from_json(item) for item in results)
            if not page.get("next") or not results:
                break
            params["offset"] += len(results)
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
        wait = float((limits or {}).get("timeout_s", 60)) + c.HTTP_MARGIN_S
        response = await self.http.request("POST", f"{c.API}/run", json=body, timeout_s=wait)
        return RunResult.from_json(response.json())

    async def providers(self) -> list[ProviderInfo]:
        return c.providers_from((await self.http.request("GET", f"{c.API}/providers")).json())

    async def snapshots(self) -> list[SnapshotInfo]:
        """Your organization's snapshots, newest first (first page)."""
        response = await self.http.request("GET", f"{c.API}/snapshots")
        return [SnapshotInfo.from_json(entry) for entry in response.json()["results"]]

    async def snapshot_info(self, snapshot_id: str) -> SnapshotInfo:
        response = await self.http.request("GET", f"{c.API}/snapshots/{snapshot_id}")
        return SnapshotInfo.from_json(response.json())

    async def delete_snapshot(self, snapshot_id: str) -> bool:
        """Delete a snapshot and its archive; False when it was not found."""
        try:
            await self.http.request("DELETE", f"{c.API}/snapshots/{snapshot_id}")
        except NotFoundError:
            return False
        return True

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
            data = (await self._request("DELETE", "")).json()
        except NotFoundError:
            return False
        self._info = SandboxInfo.from_json(data)
        return True

    async def set_timeout(self, timeout_s: int) -> SandboxInfo:
        data = (await self._request("POST", "/timeout", json={"timeout_s": timeout_s})).json()
        self._info = SandboxInfo.from_json(data)
        return self._info

    async def stats(self) -> SandboxStats:
        return SandboxStats.from_json((await self._request("GET", "/stats")).json())

    async def create_token(self, scopes: list[str], *, ttl_s: int = 900) -> SandboxToken:
        response = await self._request("POST", "/tokens", json={"scopes": scopes, "ttl_s": ttl_s})
        return c.token_from(response.json())

    async def get_url(self, port: int, *, ttl_s: int = 900) -> str:
        token = await self.create_token(["ports"], ttl_s=ttl_s)
        return c.preview_url(self.client.config.url, self.id, port, token.token)

    async def pause(self) -> SandboxInfo:
        """Freeze every process, memory kept (see Sandbox.pause)."""
        self._info = SandboxInfo.from_json((await self._request("POST", "/pause")).json())
        return self._info

    async def resume(self) -> SandboxInfo:
        """Thaw a paused sandbox, or start an archived one again (see Sandbox.resume)."""
        self._info = SandboxInfo.from_json((await self._request("POST", "/resume")).json())
        return self._info

    async def snapshot(self, name: str = "") -> SnapshotInfo:
        """Save /workspace and /tmp as a snapshot."""
        response = await self._request("POST", "/snapshots", json={"name": name})
        return SnapshotInfo.from_json(response.json())

    async def snapshots(self) -> list[SnapshotInfo]:
        """This sandbox's snapshots, newest first (first page)."""
        response = await self._request("GET", "/snapshots")
        return [SnapshotInfo.from_json(entry) for entry in response.json()["results"]]

    async def fork(self) -> AsyncSandbox:
        """A new sandbox with a copy of this one's files, on the same client."""
        response = await self._request("POST", "/fork")
        return AsyncSandbox(self.client, SandboxInfo.from_json(response.json()))

    async def languages(self) -> list[Language]:
        """The languages this sandbox runs (its template's): what run_code's `language` takes."""
        response = await self._request("GET", "/languages")
        return [Language.from_json(entry) for entry in response.json()["results"]]

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
        body: dict[str, Any] = {"code": code, "encoding": "base64"}
        if language:
            body["language"] = language
        if stdin is not None:
            body["stdin"] = stdin
        if timeout_s is not None:
            body["timeout_s"] = timeout_s
        if compile_timeout_s is not None:
            body["compile_timeout_s"] = compile_timeout_s
        wait = (timeout_s or 300) + (compile_timeout_s or 30) + c.HTTP_MARGIN_S
        response = await self._request("POST", "/code", json=body, timeout_s=wait)
        return CommandResult.from_json(response.json())

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


class AsyncCommandHandle:
    """Like `CommandHandle`: a command streaming over the exec socket, in a reader task."""

    def __init__(self, ws: ClientConnection, message: dict[str, Any], state: c.ExecState):
        self._ws = ws
        self.id: str = message["id"]
        self._state = state
        self._started = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        try:
            async for frame in self._ws:
                over = self._state.feed(frame)
                if self._state.pid is not None:
                    self._started.set()
                if over:
                    break
        except ConnectionClosed as exc:
            if self._state.result is None and self._state.error is None:
                self._state.error = c.ws_close_error(exc.rcvd.code if exc.rcvd else None, "")
        finally:
            self._started.set()
            await self._ws.close()

    async def pid(self) -> int | None:
        await asyncio.wait_for(self._started.wait(), 30)
        return self._state.pid

    async def _send(self, message: dict[str, Any]) -> None:
        try:
            await self._ws.send(json.dumps(message))
        except ConnectionClosed:
            pass

    async def send_stdin(self, data: str, *, eof: bool = False) -> None:
        await self._send({"type": "stdin", "id": self.id, "data": data, "eof": eof})

    async def close_stdin(self) -> None:
        await self._send({"type": "stdin_close", "id": self.id})

    async def signal(self, signal: str = "SIGINT") -> None:
        await self._send({"type": "signal", "id": self.id, "signal": signal})

    async def kill(self) -> bool:
        if self._task.done():
            return False
        await self._send({"type": "cancel", "id": self.id})
        return True

    async def wait(self, timeout_s: float | None = None) -> CommandResult:
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout_s)
        except TimeoutError:
            raise RequestTimeoutError("The command is still running.", code="timeout") from None
        if self._state.error is not None:
            raise self._state.error
        assert self._state.result is not None
        return self._state.result

    @property
    def finished(self) -> bool:
        return self._task.done()


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
        # base64: the exact bytes come back (CommandResult.stdout_bytes), text is decoded here.
        body = {**c.command_body(cmd, args, cwd, env, stdin, timeout_s), "encoding": "base64"}
        wait = (timeout_s or 300) + c.HTTP_MARGIN_S
        response = await self._sandbox._request("POST", "/commands", json=body, timeout_s=wait)
        return CommandResult.from_json(response.json())

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
        body = {**c.command_body(cmd, args, cwd, env, None, None), "background": True}
        response = await self._sandbox._request("POST", "/commands", json=body)
        return ProcessInfo.from_json(response.json())

    async def output(
        self, pid: int, *, stdout_offset: int = 0, stderr_offset: int = 0
    ) -> BackgroundOutput:
        """What a command from `start()` wrote after the given byte offsets (pass back the
        previous answer's offsets to read only what is new), and whether it still runs."""
        params = {
            "stdout_offset": stdout_offset,
            "stderr_offset": stderr_offset,
            "encoding": "base64",
        }
        response = await self._sandbox._request(
            "GET", f"/processes/{int(pid)}/output", params=params
        )
        return BackgroundOutput.from_json(response.json())

    async def _stream(
        self,
        message: dict[str, Any],
        stdin: str | None,
        on_stdout: c.OutputCallback | None,
        on_stderr: c.OutputCallback | None,
        keep_stdin_open: bool,
    ) -> AsyncCommandHandle:
        ws = await _open(self._sandbox.client.http, f"/ws/sandboxes/{self._sandbox.id}/exec")
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
        data = (
            await self._sandbox._request("GET", "/files/content", params={"path": path})
        ).content
        return data.decode() if format == "text" else bytes(data)

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
        headers = {"Content-Type": "application/octet-stream"}
        if total is not None and not isinstance(body, bytes):
            headers["Content-Length"] = str(total)
        response = await self._sandbox._request(
            "PUT", "/files/content", params={"path": path}, content=body, headers=headers
        )
        return FileEntry.from_json(response.json())

    async def list(self, path: str = ".", *, recursive: bool = False) -> list[FileEntry]:
        params = {"path": path, "recursive": "true" if recursive else "false"}
        data = (await self._sandbox._request("GET", "/files", params=params)).json()
        return [FileEntry.from_json(e) for e in data.get("entries") or []]

    async def stat(self, path: str) -> FileEntry:
        response = await self._sandbox._request("GET", "/files/stat", params={"path": path})
        return FileEntry.from_json(response.json())

    async def exists(self, path: str) -> bool:
        """Whether anything is at `path` (a dangling symlink counts)."""
        response = await self._sandbox._request("GET", "/files/exists", params={"path": path})
        return bool(response.json()["exists"])

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        params = {"path": path, "recursive": "true" if recursive else "false"}
        await self._sandbox._request("DELETE", "/files", params=params)

    async def rename(self, src: str, dst: str) -> FileEntry:
        response = await self._sandbox._request(
            "POST", "/files/move", json={"from": src, "to": dst}
        )
        return FileEntry.from_json(response.json())

    async def make_dir(self, path: str) -> FileEntry:
        response = await self._sandbox._request("POST", "/files/mkdir", json={"path": path})
        return FileEntry.from_json(response.json())

    async def watch(
        self,
        path: str = ".",
        *,
        on_event: Callable[[FileEvent], Any],
        recursive: bool = True,
        ignore: list[str] | None = None,
        debounce_ms: int = 100,
    ) -> AsyncWatcher:
        ws = await _open(self._sandbox.client.http, f"/ws/sandboxes/{self._sandbox.id}/events")
        watcher = AsyncWatcher(ws, on_event)
        await watcher._start(path, recursive, ignore, debounce_ms)
        return watcher


class AsyncWatcher:
    def __init__(self, ws: ClientConnection, on_event: Callable[[FileEvent], Any]) -> None:
        self._ws = ws
        self.on_event = on_event
        self.id = "w1"
        self._task: asyncio.Task[None] | None = None

    async def _next(self, kind: str) -> dict[str, Any]:
        while True:
            try:
                frame = await asyncio.wait_for(self._ws.recv(), 30)
            except TimeoutError:
                await self._ws.close()
                raise RequestTimeoutError(
                    f"No '{kind}' from the events socket.", code="timeout"
                ) from None
            except ConnectionClosed as exc:
                raise c.ws_close_error(exc.rcvd.code if exc.rcvd else None, "") from None
            message = json.loads(frame)
            if message.get("type") == "error":
                await self._ws.close()
                raise c.ws_error(message)
            if message.get("type") == kind:
                return dict(message)

    async def _start(
        self, path: str, recursive: bool, ignore: list[str] | None, debounce_ms: int
    ) -> None:
        ready = await self._next("ready")
        if "files" not in (ready.get("signals") or []):
            await self._ws.close()
            raise error_from("scope_missing", "This credential cannot watch files.", 403)
        message: dict[str, Any] = {
            "type": "watch",
            "id": self.id,
            "path": path,
            "recursive": recursive,
            "debounce_ms": debounce_ms,
        }
        if ignore:
            message["ignore"] = list(ignore)
        await self._ws.send(json.dumps(message))
        await self._next("watching")
        self._task = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        try:
            async for frame in self._ws:
                message = json.loads(frame)
                if message.get("type") == "files" and message.get("watcher") == self.id:
                    for event in c.file_events(message):
                        self.on_event(event)
        except ConnectionClosed:
            pass

    async def stop(self) -> None:
        await self._ws.close()
        if self._task is not None:
            await asyncio.wait([self._task], timeout=5)


class AsyncProcesses:
    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    async def list(self) -> list[ProcessInfo]:
        data = (await self._sandbox._request("GET", "/processes")).json()
        return [ProcessInfo.from_json(p) for p in data.get("results") or []]

    async def start(
        self,
        cmd: str,
        args: list[str] | None = None,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ProcessInfo:
        body = c.command_body(cmd, args, cwd, env, None, None)
        return ProcessInfo.from_json(
            (await self._sandbox._request("POST", "/processes", json=body)).json()
        )

    async def signal(self, pid: int, signal: str = "SIGTERM") -> None:
        await self._sandbox._request(
            "POST", f"/processes/{int(pid)}/signal", json={"signal": signal}
        )

    async def kill(self, pid: int) -> bool:
        try:
            await self.signal(pid, "SIGKILL")
        except NotFoundError as exc:
            if exc.code == "sandbox_not_found":
                raise
            return False
        return True


class AsyncTerminal:
    """Like `Terminal`, with a reader task."""

    def __init__(
        self,
        ws: ClientConnection,
        terminal_id: str,
        on_data: Callable[[bytes], Any] | None,
        terminals: AsyncTerminals,
    ) -> None:
        self.id = terminal_id
        self.on_data = on_data
        self._ws = ws
        self._terminals = terminals
        self._buffer = bytearray()
        self.exit_code: int | None = None
        self.error: SandpitError | None = None
        self._task = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        try:
            async for frame in self._ws:
                if isinstance(frame, bytes):
                    if self.on_data is None:
                        self._buffer += frame
                    else:
                        self.on_data(frame)
                    continue
                message = json.loads(frame)
                if message.get("type") == "exit":
                    self.exit_code = message.get("code")
                elif message.get("type") == "error":
                    self.error = c.ws_error(message)
        except ConnectionClosed:
            pass

    def output(self) -> bytes:
        data, self._buffer = bytes(self._buffer), bytearray()
        return data

    async def send(self, data: bytes | str) -> None:
        try:
            await self._ws.send(data.encode() if isinstance(data, str) else data)
        except ConnectionClosed as exc:
            raise SandpitConnectionError("The terminal socket is closed.", code="closed") from exc

    async def resize(self, cols: int, rows: int) -> None:
        try:
            await self._ws.send(json.dumps({"type": "resize", "cols": cols, "rows": rows}))
        except ConnectionClosed:
            pass

    async def wait(self, timeout_s: float | None = None) -> int | None:
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout_s)
        except TimeoutError:
            raise RequestTimeoutError("The terminal is still running.", code="timeout") from None
        if self.error is not None and self.exit_code is None:
            raise self.error
        return self.exit_code

    async def close(self, *, kill: bool = True) -> None:
        await self._ws.close()
        await asyncio.wait([self._task], timeout=5)
        if kill:
            await self._terminals.kill(self.id)


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
        body: dict[str, Any] = {"cols": cols, "rows": rows}
        if shell:
            body["shell"] = shell
        if cwd:
            body["cwd"] = cwd
        if env:
            body["env"] = dict(env)
        response = await self._sandbox._request("POST", "/terminals", json=body)
        return await self.attach(TerminalInfo.from_json(response.json()).id, on_data=on_data)

    async def attach(
        self, terminal_id: str, *, on_data: Callable[[bytes], Any] | None = None
    ) -> AsyncTerminal:
        ws = await _open(
            self._sandbox.client.http, f"/ws/sandboxes/{self._sandbox.id}/terminals/{terminal_id}"
        )
        return AsyncTerminal(ws, terminal_id, on_data, self)

    async def list(self) -> list[TerminalInfo]:
        data = (await self._sandbox._request("GET", "/terminals")).json()
        return [TerminalInfo.from_json(t) for t in data.get("results") or []]

    async def resize(self, terminal_id: str, cols: int, rows: int) -> None:
        await self._sandbox._request(
            "POST", f"/terminals/{terminal_id}/resize", json={"cols": cols, "rows": rows}
        )

    async def kill(self, terminal_id: str) -> bool:
        try:
            await self._sandbox._request("DELETE", f"/terminals/{terminal_id}")
        except NotFoundError as exc:
            if exc.code == "sandbox_not_found":
                raise
            return False
        return True
