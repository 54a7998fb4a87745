"""The synchronous client: `Sandpit` (the connection) and `Sandbox` (one sandbox).

Each REST operation is described once in _calls.py (shared with the async client) and sent
here with `self.http.call(...)`; the sockets are in _sync_realtime.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal, overload

from . import _calls as calls
from . import _common as c
from ._http import HttpClient, RetryPolicy
from ._sync_realtime import CommandHandle, Terminal, Watcher, exec_handle, open_socket
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


class Sandpit:
    """A connection to a Sandpit server with an API key.

    `url` and `api_key` default to SANDPIT_URL / SANDPIT_API_KEY, then `sandpit login`'s file.
    """

    def __init__(
        self,
        api_key: str | None = None,
        url: str | None = None,
        *,
        timeout_s: float = 60.0,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.config: Config = resolve_config(url, api_key)
        self.http = HttpClient(self.config, timeout_s=timeout_s, retry=retry)

    # sandboxes ------------------------------------------------------------------------------

    def create(
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
    ) -> Sandbox:
        """A new running sandbox. `timeout_s` is its idle timeout (seconds). `snapshot`
        (snp_...): start with that snapshot's files, on its provider and template."""
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
        return Sandbox(self, self.http.call(calls.sandbox_create(body)))

    def connect(self, sandbox_id: str) -> Sandbox:
        """An existing sandbox of your organization (NotFoundError otherwise)."""
        return Sandbox(self, self.sandbox_info(sandbox_id))

    def sandbox_info(self, sandbox_id: str) -> SandboxInfo:
        return self.http.call(calls.sandbox_info(sandbox_id))

    def list(
        self,
        *,
        state: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        include_destroyed: bool = False,
    ) -> list[SandboxInfo]:
        """Your organization's sandboxes, newest first (every page)."""
        params = calls.sandboxes_first_params(state, include_destroyed)
        found: list[SandboxInfo] = []
        more = True
        while more:
            page, more = self.http.call(calls.sandboxes_page(params))
            found.extend(page)
            params["offset"] += len(page)
        return [info for info in found if c.matches(info, metadata)]

    # one-shot runs and providers ------------------------------------------------------------------

    def run(
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
        """The one-shot judge: an ephemeral sandbox runs `code` or `command` and is destroyed.
        `limits`: timeout_s (the run), compile_timeout_s (a compiled language's compile step),
        memory_mb, pids. A compile failure is the 'compile_error' verdict."""
        return self.http.call(
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

    def providers(self) -> list[ProviderInfo]:
        return self.http.call(calls.providers())

    # snapshots ------------------------------------------------------------------------------

    def snapshots(self) -> list[SnapshotInfo]:
        """Your organization's snapshots, newest first (first page)."""
        return self.http.call(calls.snapshots())

    def snapshot_info(self, snapshot_id: str) -> SnapshotInfo:
        return self.http.call(calls.snapshot_info(snapshot_id))

    def delete_snapshot(self, snapshot_id: str) -> bool:
        """Delete a snapshot and its archive; False when it was not found."""
        return self.http.call(calls.snapshot_delete(snapshot_id))

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Sandpit:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Sandbox:
    """One sandbox. `with Sandbox.create() as sbx:` destroys it on exit."""

    def __init__(self, client: Sandpit, info: SandboxInfo, *, owns_client: bool = False) -> None:
        self.client = client
        self.id = info.id
        self._info = info
        self._owns_client = owns_client
        self.commands = Commands(self)
        self.files = Files(self)
        self.processes = Processes(self)
        self.terminals = Terminals(self)

    # construction ---------------------------------------------------------------------------

    @classmethod
    def create(
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
        client: Sandpit | None = None,
    ) -> Sandbox:
        owner = client is None
        client = client or Sandpit(api_key, url)
        try:
            sandbox = client.create(
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
                client.close()
            raise
        sandbox._owns_client = owner
        return sandbox

    @classmethod
    def connect(
        cls,
        sandbox_id: str,
        *,
        api_key: str | None = None,
        url: str | None = None,
        client: Sandpit | None = None,
    ) -> Sandbox:
        owner = client is None
        client = client or Sandpit(api_key, url)
        try:
            sandbox = client.connect(sandbox_id)
        except BaseException:
            if owner:
                client.close()
            raise
        sandbox._owns_client = owner
        return sandbox

    @classmethod
    def list(
        cls,
        *,
        metadata: Mapping[str, Any] | None = None,
        state: str | None = None,
        api_key: str | None = None,
        url: str | None = None,
        client: Sandpit | None = None,
    ) -> list[SandboxInfo]:
        if client is not None:
            return client.list(metadata=metadata, state=state)
        with Sandpit(api_key, url) as own:
            return own.list(metadata=metadata, state=state)

    # lifecycle --------------------------------------------------------------------------------

    def path(self, tail: str = "") -> str:
        return c.sandbox_path(self.id, tail)

    def info(self) -> SandboxInfo:
        self._info = self.client.sandbox_info(self.id)
        return self._info

    def is_running(self) -> bool:
        return self.info().state == "running"

    def kill(self) -> bool:
        """Destroy the sandbox. False when it was already destroyed or is not found."""
        try:
            if self.client.sandbox_info(self.id).state == "destroyed":
                return False
            self._info = self.client.http.call(calls.sandbox_destroy(self.id))
        except NotFoundError:
            return False
        return True

    def set_timeout(self, timeout_s: int) -> SandboxInfo:
        """Set the idle timeout (seconds, 10 .. 7 days); counts as activity."""
        self._info = self.client.http.call(calls.sandbox_set_timeout(self.id, timeout_s))
        return self._info

    def stats(self) -> SandboxStats:
        return self.client.http.call(calls.sandbox_stats(self.id))

    def create_token(self, scopes: list[str], *, ttl_s: int = 900) -> SandboxToken:
        """A short-lived token for this sandbox only (scopes: terminal, files, exec, ports)."""
        return self.client.http.call(calls.sandbox_token(self.id, scopes, ttl_s))

    def get_url(self, port: int, *, ttl_s: int = 900) -> str:
        """A preview URL for a server listening on `port`, carrying a token (scope `ports`)
        valid for `ttl_s` seconds: open it in a browser or fetch it without other credentials."""
        token = self.create_token(["ports"], ttl_s=ttl_s)
        return c.preview_url(self.client.config.url, self.id, port, token.token)

    def pause(self) -> SandboxInfo:
        """Freeze every process, memory kept; its idle clock stops. Other operations answer
        409 'sandbox_paused' until `resume()`."""
        self._info = self.client.http.call(calls.sandbox_pause(self.id))
        return self._info

    def resume(self) -> SandboxInfo:
        """Thaw a paused sandbox, or start an archived one again from its files (without
        its processes)."""
        self._info = self.client.http.call(calls.sandbox_resume(self.id))
        return self._info

    def snapshot(self, name: str = "") -> SnapshotInfo:
        """Save /workspace and /tmp as a snapshot (`Sandpit.create(snapshot=...)` starts
        new sandboxes from it)."""
        return self.client.http.call(calls.sandbox_snapshot(self.id, name))

    def snapshots(self) -> list[SnapshotInfo]:
        """This sandbox's snapshots, newest first (first page)."""
        return self.client.http.call(calls.sandbox_snapshots(self.id))

    def fork(self) -> Sandbox:
        """A new sandbox with a copy of this one's files, on the same client."""
        return Sandbox(self.client, self.client.http.call(calls.sandbox_fork(self.id)))

    def languages(self) -> list[Language]:
        """The languages this sandbox runs (its template's): what run_code's `language` takes."""
        return self.client.http.call(calls.sandbox_languages(self.id))

    def run_code(
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
        """Run a snippet in one of the sandbox's languages (see languages(); detected when
        `language` is None). Compiled languages compile first, within `compile_timeout_s`
        (default 30); `timeout_s` limits the run. Streamed (with a callback): the compiler's
        messages arrive on stderr."""
        if on_stdout or on_stderr:
            message = c.run_message(code=code, language=language, timeout_s=timeout_s)
            return self.commands._stream(message, stdin, on_stdout, on_stderr, False).wait()
        call = calls.code_run(
            self.id,
            code,
            language=language,
            stdin=stdin,
            timeout_s=timeout_s,
            compile_timeout_s=compile_timeout_s,
        )
        return self.client.http.call(call)

    def close(self) -> None:
        """Release the connection this sandbox opened (the sandbox keeps running)."""
        if self._owns_client:
            self.client.close()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.kill()
        finally:
            self.close()

    def __repr__(self) -> str:
        return f"<Sandbox {self.id} {self._info.state} on {self._info.provider}>"


class Commands:
    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox

    @overload
    def run(
        self,
        cmd: str,
        args: list[str] | None = ...,
        *,
        cwd: str | None = ...,
        env: Mapping[str, str] | None = ...,
        stdin: str | None = ...,
        timeout_s: float | None = ...,
        background: Literal[False] = ...,
        on_stdout: c.OutputCallback | None = ...,
        on_stderr: c.OutputCallback | None = ...,
    ) -> CommandResult: ...

    @overload
    def run(
        self,
        cmd: str,
        args: list[str] | None = ...,
        *,
        cwd: str | None = ...,
        env: Mapping[str, str] | None = ...,
        stdin: str | None = ...,
        timeout_s: float | None = ...,
        background: Literal[True],
        on_stdout: c.OutputCallback | None = ...,
        on_stderr: c.OutputCallback | None = ...,
    ) -> CommandHandle: ...

    def run(
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
    ) -> CommandResult | CommandHandle:
        """Run `cmd` (under `sh -c`, or directly with `args`) and return its result.

        With `on_stdout`/`on_stderr` the output streams over the exec socket as it comes;
        with `background=True` a `CommandHandle` returns at once (`wait()`, `kill()`,
        `send_stdin()`); stdin stays open until `close_stdin()` unless `stdin` was given.
        A background command lives as long as its handle's socket: it is killed when this
        process exits (use `commands.start()` for one that outlives it, output kept).
        """
        if background or on_stdout or on_stderr:
            message = c.run_message(cmd=cmd, args=args, cwd=cwd, env=env, timeout_s=timeout_s)
            handle = self._stream(message, stdin, on_stdout, on_stderr, background)
            return handle if background else handle.wait()
        call = calls.command_run(self._sandbox.id, cmd, args, cwd, env, stdin, timeout_s)
        return self._sandbox.client.http.call(call)

    def start(
        self,
        cmd: str,
        args: list[str] | None = None,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ProcessInfo:
        """Start `cmd` detached (it outlives this client) and return at once; read what it
        writes with `output(pid)`, stop it with `sandbox.processes.kill(pid)`."""
        return self._sandbox.client.http.call(
            calls.command_start(self._sandbox.id, cmd, args, cwd, env)
        )

    def output(
        self, pid: int, *, stdout_offset: int = 0, stderr_offset: int = 0
    ) -> BackgroundOutput:
        """What a command from `start()` wrote after the given byte offsets (pass back the
        previous answer's offsets to read only what is new), and whether it still runs."""
        call = calls.command_output(self._sandbox.id, pid, stdout_offset, stderr_offset)
        return self._sandbox.client.http.call(call)

    def _stream(
        self,
        message: dict[str, Any],
        stdin: str | None,
        on_stdout: c.OutputCallback | None,
        on_stderr: c.OutputCallback | None,
        keep_stdin_open: bool,
    ) -> CommandHandle:
        client = self._sandbox.client
        return exec_handle(
            client.http.ws_base,
            f"/ws/sandboxes/{self._sandbox.id}/exec",
            client.config.api_key,
            message,
            stdin=stdin,
            on_stdout=on_stdout,
            on_stderr=on_stderr,
            keep_stdin_open=keep_stdin_open and stdin is None,
        )


class Files:
    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox

    def _request(self, method: str, tail: str, **kwargs: Any) -> Any:
        return self._sandbox.client.http.request(method, self._sandbox.path(tail), **kwargs)

    @overload
    def read(self, path: str, format: Literal["bytes"] = ...) -> bytes: ...
    @overload
    def read(self, path: str, format: Literal["text"]) -> str: ...
    @overload
    def read(self, path: str, format: Literal["stream"]) -> Iterator[bytes]: ...

    def read(self, path: str, format: str = "bytes") -> bytes | str | Iterator[bytes]:  # noqa: A002
        """The file's content as bytes, UTF-8 text, or an iterator of chunks (for big files)."""
        if format == "stream":
            response = self._request("GET", "/files/content", params={"path": path}, stream=True)

            def chunks() -> Iterator[bytes]:
                try:
                    yield from response.iter_bytes(c.CHUNK_BYTES)
                finally:
                    response.close()

            return chunks()
        if format not in ("bytes", "text"):
            raise ValueError("format is 'bytes', 'text' or 'stream'")
        data = self._sandbox.client.http.call(calls.file_content(self._sandbox.id, path))
        return data.decode() if format == "text" else data

    def write(
        self,
        path: str,
        data: bytes | str | Any,
        *,
        on_progress: c.ProgressCallback | None = None,
    ) -> FileEntry:
        """Create or replace a file (parents are created) from bytes, text or a binary file
        object, streamed; `on_progress(done_bytes, total_bytes)` is called as it goes."""
        body, total = c.file_chunks(data, on_progress)
        return self._sandbox.client.http.call(calls.file_write(self._sandbox.id, path, body, total))

    def list(self, path: str = ".", *, recursive: bool = False) -> list[FileEntry]:
        return self._sandbox.client.http.call(calls.file_list(self._sandbox.id, path, recursive))

    def stat(self, path: str) -> FileEntry:
        return self._sandbox.client.http.call(calls.file_stat(self._sandbox.id, path))

    def exists(self, path: str) -> bool:
        """Whether anything is at `path` (a dangling symlink counts)."""
        return self._sandbox.client.http.call(calls.file_exists(self._sandbox.id, path))

    def remove(self, path: str, *, recursive: bool = False) -> None:
        self._sandbox.client.http.call(calls.file_remove(self._sandbox.id, path, recursive))

    def rename(self, src: str, dst: str) -> FileEntry:
        return self._sandbox.client.http.call(calls.file_move(self._sandbox.id, src, dst))

    def make_dir(self, path: str) -> FileEntry:
        return self._sandbox.client.http.call(calls.file_mkdir(self._sandbox.id, path))

    def watch(
        self,
        path: str = ".",
        *,
        on_event: Callable[[FileEvent], Any],
        recursive: bool = True,
        ignore: list[str] | None = None,
        debounce_ms: int = 100,
    ) -> Watcher:
        """Call `on_event` for each change under `path` until `stop()` (feature `watch`)."""
        client = self._sandbox.client
        ws = open_socket(
            client.http.ws_base, f"/ws/sandboxes/{self._sandbox.id}/events", client.config.api_key
        )
        return Watcher(
            ws,
            path=path,
            recursive=recursive,
            on_event=on_event,
            ignore=ignore,
            debounce_ms=debounce_ms,
        )


class Processes:
    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox

    def list(self) -> list[ProcessInfo]:
        return self._sandbox.client.http.call(calls.process_list(self._sandbox.id))

    def start(
        self,
        cmd: str,
        args: list[str] | None = None,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ProcessInfo:
        """A detached process (a server, a long job) that outlives this client."""
        return self._sandbox.client.http.call(
            calls.process_start(self._sandbox.id, cmd, args, cwd, env)
        )

    def signal(self, pid: int, signal: str = "SIGTERM") -> None:
        self._sandbox.client.http.call(calls.process_signal(self._sandbox.id, pid, signal))

    def kill(self, pid: int) -> bool:
        """SIGKILL. False when there is no such process (already gone)."""
        return self._sandbox.client.http.call(calls.process_kill(self._sandbox.id, pid))


class Terminals:
    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox

    def create(
        self,
        cols: int = 80,
        rows: int = 24,
        *,
        shell: str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        on_data: Callable[[bytes], Any] | None = None,
    ) -> Terminal:
        """A new shell on a PTY, attached (feature `terminal`)."""
        call = calls.terminal_create(self._sandbox.id, cols, rows, shell, cwd, env)
        return self.attach(self._sandbox.client.http.call(call).id, on_data=on_data)

    def attach(
        self, terminal_id: str, *, on_data: Callable[[bytes], Any] | None = None
    ) -> Terminal:
        """Join an existing terminal (the recent scrollback arrives first)."""
        client = self._sandbox.client
        ws = open_socket(
            client.http.ws_base,
            f"/ws/sandboxes/{self._sandbox.id}/terminals/{terminal_id}",
            client.config.api_key,
        )
        return Terminal(
            ws, terminal_id=terminal_id, on_data=on_data, on_kill=lambda: self.kill(terminal_id)
        )

    def list(self) -> list[TerminalInfo]:
        return self._sandbox.client.http.call(calls.terminal_list(self._sandbox.id))

    def resize(self, terminal_id: str, cols: int, rows: int) -> None:
        self._sandbox.client.http.call(
            calls.terminal_resize(self._sandbox.id, terminal_id, cols, rows)
        )

    def kill(self, terminal_id: str) -> bool:
        """End the shell and its processes. False when it was already gone."""
        return self._sandbox.client.http.call(calls.terminal_kill(self._sandbox.id, terminal_id))
