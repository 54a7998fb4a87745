"""A local stand-in for the e2b SDK's `Sandbox` class surface that E2BProvider calls.

What is real: every value and exception type comes from the installed `e2b` SDK
(EntryInfo, SandboxInfo, CommandResult, CommandExitException, FileNotFoundException...),
so the adapter's translation is exercised against the SDK's own classes. Each sandbox is a
real pid + mount namespace (a holder process is its pid 1; /home/user is a bound
directory; /proc shows only the sandbox), commands are real processes entered with
nsenter, terminals are real PTYs, files are real files. Needs root, `unshare`, `nsenter`.
`test_fake_matches_sdk_signatures` keeps every method's parameter names inside the real
SDK's signatures.

What is not real: E2B's API and envd (no network reaches them here). Where envd's
behaviour is documented we mimic it (a signal death is exit code -1 plus Go's
"signal: terminated" text, `write` creates parent directories, `remove` is recursive,
`make_dir` returns False when the directory exists, the stream `timeout` raises
TimeoutException and leaves the process running); `watch_dir` diffs snapshots instead
of using inotify; the network namespace is the host's (so `get_host` answers
127.0.0.1:port, as the SDK does in debug mode).
"""

from __future__ import annotations

import codecs
import contextlib
import fcntl
import os
import pty
import queue
import shutil
import signal
import struct
import subprocess
import termios
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import e2b
from e2b.api.client.models.sandbox_state import SandboxState

HOME = "/home/user"
_GO_SIGNAL_TEXT = {
    signal.SIGHUP: "hangup",
    signal.SIGINT: "interrupt",
    signal.SIGKILL: "killed",
    signal.SIGTERM: "terminated",
    signal.SIGPIPE: "broken pipe",
    signal.SIGSEGV: "segmentation fault",
}


class FakeCloud:
    """The fake's whole "E2B account": sandboxes as directories under `root`."""

    def __init__(self, root: Path, api_key: str) -> None:
        self.root = root
        self.api_key = api_key
        self.sandboxes: dict[str, _State] = {}
        self.lock = threading.Lock()

    def check(self, opts: dict[str, Any]) -> None:
        if opts.get("api_key") != self.api_key:
            raise e2b.AuthenticationException("Invalid API key")

    def close(self) -> None:
        """Destroy every sandbox still alive (end of the test session)."""
        with self.lock:
            states, self.sandboxes = list(self.sandboxes.values()), {}
        for state in states:
            state.destroy()

    def state(self, sandbox_id: str) -> _State:
        with self.lock:
            state = self.sandboxes.get(sandbox_id)
        if state is None:
            raise e2b.SandboxNotFoundException(f"Sandbox {sandbox_id} not found")
        return state


class _State:
    def __init__(self, cloud: FakeCloud, template: str, timeout: int, metadata, envs) -> None:  # type: ignore[no-untyped-def]
        self.id = f"i{uuid.uuid4().hex[:19]}"
        self.home = cloud.root / self.id / "home-user"
        self.home.mkdir(parents=True)
        self.template = template
        self.metadata = dict(metadata or {})
        self.envs = dict(envs or {})
        self.started_at = datetime.now(UTC)
        self.end_at = self.started_at + timedelta(seconds=timeout)
        self.procs: dict[int, _Handle] = {}
        # One pid + mount namespace per sandbox, as in a VM: a holder (pid 1 inside) keeps
        # it alive with /home/user bound and its own /proc; commands join it with nsenter.
        # /home is a tmpfs in there, so the host needs no /home/user.
        self.holder = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--kill-child", "--mount", "--propagation", "private", "--mount-proc",
             "sh", "-c", 'mount -t tmpfs -o mode=755 fake-home /home && mkdir /home/user && '
             'mount --bind "$1" /home/user && echo ready && exec sleep infinity',
             "sh", str(self.home)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        assert self.holder.stdout is not None and self.holder.stdout.readline() == b"ready\n"
        children = Path(f"/proc/{self.holder.pid}/task/{self.holder.pid}/children").read_text()
        self.init_pid = int(children.split()[0])

    def spawn(self, cwd: str | None, command: list[str], **popen: Any) -> tuple[Any, int]:
        """Start a command inside the sandbox: (Popen of nsenter, the pid inside).
        nsenter waits for the command and re-raises its signal, like a direct child."""
        read_fd, write_fd = os.pipe()
        script = f'echo $$ >&{write_fd}; exec {write_fd}>&-; cd "$0" && exec "$@"'
        proc = subprocess.Popen(
            ["nsenter", "-t", str(self.init_pid), "-p", "-m", "--",
             "/bin/bash", "-c", script, cwd or HOME, *command],
            pass_fds=(write_fd,), cwd="/", start_new_session=True, **popen,
        )  # fmt: skip
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as pipe:
            inner = pipe.readline().strip()  # nsenter itself keeps the pipe open
        return proc, int(inner or -1)

    def destroy(self) -> None:
        # nsenter stops itself when its child is stopped (job-control propagation), and a
        # stopped nsenter cannot reap: continue and kill every one before tearing down.
        for handle in list(self.procs.values()):
            with contextlib.suppress(ProcessLookupError):
                handle._popen.send_signal(signal.SIGCONT)
                handle.kill()
                handle._popen.kill()
            handle._popen.wait()
        # Killing pid 1 of the namespace makes the kernel kill everything in it.
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.init_pid, signal.SIGKILL)
        self.holder.wait()
        shutil.rmtree(self.home.parent, ignore_errors=True)

    def host_path(self, path: str) -> Path:
        if path != HOME and not path.startswith(HOME + "/"):
            raise e2b.InvalidArgumentException(f"the fake only serves {HOME}, not {path}")
        return self.home / path[len(HOME) :].lstrip("/")

    def sandbox_path(self, host: Path) -> str:
        rel = host.relative_to(self.home).as_posix()
        return HOME if rel == "." else f"{HOME}/{rel}"

    def env(self, envs: dict[str, str] | None) -> dict[str, str]:
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": HOME,
            "USER": "user",
            "LANG": "C.UTF-8",
            **self.envs,
            **(envs or {}),
        }


class _Handle:
    """Mirrors e2b's CommandHandle: pid, wait(on_*), send_stdin, close_stdin, kill, disconnect."""

    def __init__(
        self, popen: subprocess.Popen[bytes], pid: int, timeout: float | None, master: int | None
    ):
        self.pid = pid
        """The pid inside the sandbox (what envd reports)."""
        self._popen = popen
        self._deadline = time.monotonic() + timeout if timeout else None
        self._events: queue.Queue[tuple[str, bytes | None]] = queue.Queue()
        self._disconnected = False
        self._master = master
        streams = [("pty", master)] if master is not None else []
        if popen.stdout is not None:
            streams += [("stdout", popen.stdout.fileno()), ("stderr", popen.stderr.fileno())]  # type: ignore[union-attr]
        self._open = len(streams)
        for name, fd in streams:
            threading.Thread(target=self._read, args=(name, fd), daemon=True).start()

    def _read(self, name: str, fd: int) -> None:
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the PTY's last holder exited
                chunk = b""
            if not self._disconnected:
                self._events.put((name, chunk or None))
            if not chunk:
                return

    def wait(self, on_pty=None, on_stdout=None, on_stderr=None):  # type: ignore[no-untyped-def]
        decoders = {
            n: codecs.getincrementaldecoder("utf-8")("replace") for n in ("stdout", "stderr")
        }
        chunks: dict[str, list[str]] = {"stdout": [], "stderr": []}
        while self._open:
            remaining = None if self._deadline is None else self._deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise e2b.TimeoutException("context deadline exceeded")
            try:
                name, chunk = self._events.get(timeout=remaining)
            except queue.Empty:
                continue
            if chunk is None:
                self._open -= 1
            elif name == "pty":
                if on_pty:
                    on_pty(chunk)
            else:
                text = decoders[name].decode(chunk)
                chunks[name].append(text)
                callback = on_stdout if name == "stdout" else on_stderr
                if callback and text:
                    callback(text)
        try:
            code = self._popen.wait(
                None if self._deadline is None else max(0.0, self._deadline - time.monotonic())
            )
        except subprocess.TimeoutExpired:
            raise e2b.TimeoutException("context deadline exceeded") from None
        error = None
        if code < 0:
            error = f"signal: {_GO_SIGNAL_TEXT.get(signal.Signals(-code), 'killed')}"
            code = -1
        out, err = "".join(chunks["stdout"]), "".join(chunks["stderr"])
        if code != 0:
            raise e2b.CommandExitException(stdout=out, stderr=err, exit_code=code, error=error)
        return e2b.CommandResult(stdout=out, stderr=err, exit_code=code, error=error)

    def send_stdin(self, data: str | bytes, request_timeout: float | None = None) -> None:
        raw = data.encode() if isinstance(data, str) else data
        if self._master is not None:
            os.write(self._master, raw)
            return
        if self._popen.stdin is None:
            raise e2b.SandboxException("stdin was not enabled for this command")
        self._popen.stdin.write(raw)
        self._popen.stdin.flush()

    def close_stdin(self, request_timeout: float | None = None) -> None:
        if self._popen.stdin is not None:
            self._popen.stdin.close()

    def kill(self) -> bool:
        """SIGKILL the command itself (nsenter's child), as envd does."""
        if self._popen.poll() is not None:
            return False
        task = Path(f"/proc/{self._popen.pid}/task/{self._popen.pid}/children")
        try:
            children = task.read_text().split()
        except FileNotFoundError:
            return False
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(child), signal.SIGKILL)
        return bool(children)

    def disconnect(self) -> None:
        self._disconnected = True


class _Commands:
    def __init__(self, state: _State) -> None:
        self._s = state

    def run(  # type: ignore[no-untyped-def]
        self,
        cmd: str,
        background=None,
        envs=None,
        user=None,
        cwd=None,
        on_stdout=None,
        on_stderr=None,
        stdin=None,
        timeout=60,
        request_timeout=None,
        *,
        retain_output=True,
    ):
        popen, pid = self._s.spawn(
            cwd,
            ["/bin/bash", "-l", "-c", cmd],
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self._s.env(envs),
        )
        handle = _Handle(popen, pid, timeout, None)
        handle.cmd = cmd  # type: ignore[attr-defined]
        handle.envs = dict(envs or {})  # type: ignore[attr-defined]
        handle.cwd = cwd  # type: ignore[attr-defined]
        self._s.procs[pid] = handle
        if background:
            return handle
        return handle.wait(on_stdout=on_stdout, on_stderr=on_stderr)

    def list(self, request_timeout=None):  # type: ignore[no-untyped-def]
        return [
            e2b.ProcessInfo(
                pid=pid, tag=None, cmd="/bin/bash", args=["-l", "-c", getattr(h, "cmd", "")],
                envs=getattr(h, "envs", {}), cwd=getattr(h, "cwd", None),
            )
            for pid, h in list(self._s.procs.items())
            if h._popen.poll() is None
        ]  # fmt: skip

    def kill(self, pid: int, request_timeout: float | None = None) -> bool:
        handle = self._s.procs.get(pid)
        return handle.kill() if handle else False

    def send_stdin(self, pid: int, data: str | bytes, request_timeout: float | None = None) -> None:
        self._s.procs[pid].send_stdin(data)

    def close_stdin(self, pid: int, request_timeout: float | None = None) -> None:
        self._s.procs[pid].close_stdin()


class _Pty:
    def __init__(self, state: _State) -> None:
        self._s = state

    def create(self, size, user=None, cwd=None, envs=None, timeout=60, request_timeout=None):  # type: ignore[no-untyped-def]
        master, slave = pty.openpty()
        self._winsize(master, size)
        popen, pid = self._s.spawn(
            cwd,
            ["/bin/bash", "-i", "-l"],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env={**self._s.env(envs), "TERM": "xterm-256color"},
        )
        os.close(slave)
        handle = _Handle(popen, pid, timeout, master)
        self._s.procs[pid] = handle
        return handle

    @staticmethod
    def _winsize(master: int, size: Any) -> None:
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", size.rows, size.cols, 0, 0))

    def send_stdin(self, pid: int, data: bytes, request_timeout: float | None = None) -> None:
        self._s.procs[pid].send_stdin(data)

    def resize(self, pid: int, size: Any, request_timeout: float | None = None) -> None:
        self._winsize(self._s.procs[pid]._master, size)  # type: ignore[arg-type]

    def kill(self, pid: int, request_timeout: float | None = None) -> bool:
        handle = self._s.procs.get(pid)
        return handle.kill() if handle else False


class _Watch:
    """Mirrors e2b's WatchHandle by diffing snapshots of the directory."""

    def __init__(self, state: _State, root: Path, recursive: bool) -> None:
        self._s, self._root, self._recursive = state, root, recursive
        self._last = self._snapshot()

    def _snapshot(self) -> dict[str, tuple[int, int, bool]]:
        found = {}
        walker = self._root.rglob("*") if self._recursive else self._root.glob("*")
        for p in walker:
            try:
                st = p.lstat()
            except FileNotFoundError:
                continue
            found[p.relative_to(self._root).as_posix()] = (st.st_mtime_ns, st.st_size, p.is_dir())
        return found

    def get_new_events(self, request_timeout: float | None = None):  # type: ignore[no-untyped-def]
        now = self._snapshot()
        T = e2b.FilesystemEventType
        events = [
            e2b.FilesystemEvent(name=n, type=T.CREATE) for n in now.keys() - self._last.keys()
        ]
        events += [
            e2b.FilesystemEvent(name=n, type=T.REMOVE) for n in self._last.keys() - now.keys()
        ]
        events += [
            e2b.FilesystemEvent(name=n, type=T.WRITE)
            for n in now.keys() & self._last.keys()
            if now[n] != self._last[n] and not now[n][2]
        ]
        self._last = now
        return events

    def stop(self, request_timeout: float | None = None) -> None:
        pass


class _Files:
    def __init__(self, state: _State) -> None:
        self._s = state

    def _entry(self, host: Path) -> Any:
        try:
            st = host.lstat()
        except FileNotFoundError:
            raise e2b.FileNotFoundException(
                f"path '{self._s.sandbox_path(host)}' does not exist"
            ) from None
        kind = e2b.FileType.SYMLINK if host.is_symlink() else (
            e2b.FileType.DIR if host.is_dir() else e2b.FileType.FILE
        )  # fmt: skip
        return e2b.EntryInfo(
            name=host.name, type=kind, path=self._s.sandbox_path(host), size=st.st_size,
            mode=st.st_mode & 0o777, permissions="", owner="user", group="user",
            modified_time=datetime.fromtimestamp(st.st_mtime, UTC),
            symlink_target=os.readlink(host) if host.is_symlink() else None,
        )  # fmt: skip

    def read(
        self,
        path,
        format="text",
        user=None,
        request_timeout=None,
        gzip=False,
        stream_idle_timeout=None,
    ):  # type: ignore[no-untyped-def]
        host = self._s.host_path(path)
        if not host.exists():
            raise e2b.FileNotFoundException(f"file '{path}' does not exist")
        if host.is_dir():
            raise e2b.InvalidArgumentException(f"path '{path}' is a directory")
        data = host.read_bytes()
        return bytearray(data) if format == "bytes" else data.decode()

    def write(
        self,
        path,
        data,
        user=None,
        request_timeout=None,
        gzip=False,
        use_octet_stream=None,
        metadata=None,
    ):  # type: ignore[no-untyped-def]
        host = self._s.host_path(path)
        host.parent.mkdir(parents=True, exist_ok=True)
        host.write_bytes(data.encode() if isinstance(data, str) else bytes(data))
        return e2b.WriteInfo(name=host.name, type=e2b.FileType.FILE, path=path)

    def get_info(self, path, user=None, request_timeout=None):  # type: ignore[no-untyped-def]
        return self._entry(self._s.host_path(path))

    def exists(self, path, user=None, request_timeout=None):  # type: ignore[no-untyped-def]
        return os.path.lexists(self._s.host_path(path))

    def list(self, path, depth=1, user=None, request_timeout=None):  # type: ignore[no-untyped-def]
        host = self._s.host_path(path)
        if not host.exists():
            raise e2b.FileNotFoundException(f"directory '{path}' does not exist")
        if not host.is_dir():
            raise e2b.InvalidArgumentException(f"path '{path}' is not a directory")
        out = []

        def walk(d: Path, level: int) -> None:
            for child in sorted(d.iterdir()):
                out.append(self._entry(child))
                if child.is_dir() and not child.is_symlink() and (not depth or level < depth):
                    walk(child, level + 1)

        walk(host, 1)
        return out

    def make_dir(self, path, user=None, request_timeout=None):  # type: ignore[no-untyped-def]
        host = self._s.host_path(path)
        if host.is_dir():
            return False
        if host.exists():
            raise e2b.InvalidArgumentException(f"path '{path}' exists and is not a directory")
        host.mkdir(parents=True)
        return True

    def remove(self, path, user=None, request_timeout=None):  # type: ignore[no-untyped-def]
        host = self._s.host_path(path)
        if host.is_dir() and not host.is_symlink():
            shutil.rmtree(host)
        elif os.path.lexists(host):
            host.unlink()

    def rename(self, old_path, new_path, user=None, request_timeout=None):  # type: ignore[no-untyped-def]
        src, dst = self._s.host_path(old_path), self._s.host_path(new_path)
        if not os.path.lexists(src):
            raise e2b.FileNotFoundException(f"path '{old_path}' does not exist")
        os.rename(src, dst)
        return self._entry(dst)

    def watch_dir(
        self,
        path,
        user=None,
        request_timeout=None,
        recursive=False,
        include_entry=False,
        allow_network_mounts=False,
    ):  # type: ignore[no-untyped-def]
        host = self._s.host_path(path)
        if not host.is_dir():
            raise e2b.FileNotFoundException(f"directory '{path}' does not exist")
        return _Watch(self._s, host, recursive)


class _Paginator:
    def __init__(self, items: list[Any]) -> None:
        self._items = items
        self.has_next = True

    def next_items(self, **opts: Any) -> list[Any]:
        self.has_next = False
        return self._items


class _Dual:
    """Like the SDK's class_method_variant: `Sandbox.kill(id)` and `sandbox.kill()`."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __get__(self, obj: Any, cls: type) -> Any:
        if obj is None:
            return lambda *a, **kw: self.fn(cls, *a, **kw)
        return lambda *a, **kw: self.fn(cls, obj.sandbox_id, *a, **{**obj._opts, **kw})


def fake_sandbox_class(cloud: FakeCloud) -> type:
    """A `Sandbox` class bound to one FakeCloud (pass it as E2BProvider(sandbox_class=...))."""

    class FakeSandbox:
        _cloud = cloud

        def __init__(self, state: _State, opts: dict[str, Any]) -> None:
            self.sandbox_id = state.id
            self._opts = opts
            self.files = _Files(state)
            self.commands = _Commands(state)
            self.pty = _Pty(state)

        @classmethod
        def create(
            cls,
            template=None,
            timeout=None,
            metadata=None,
            envs=None,
            secure=None,
            allow_internet_access=None,
            **opts,
        ):  # type: ignore[no-untyped-def]
            cls._cloud.check(opts)
            state = _State(cls._cloud, template or "base", timeout or 300, metadata, envs)
            with cls._cloud.lock:
                cls._cloud.sandboxes[state.id] = state
            return cls(state, opts)

        @classmethod
        def connect(cls, sandbox_id, timeout=None, **opts):  # type: ignore[no-untyped-def]
            cls._cloud.check(opts)
            return cls(cls._cloud.state(sandbox_id), opts)

        @classmethod
        def list(cls, query=None, limit=None, next_token=None, order=None, **opts):  # type: ignore[no-untyped-def]
            cls._cloud.check(opts)
            wanted = (query.metadata if query is not None else None) or {}
            with cls._cloud.lock:
                states = list(cls._cloud.sandboxes.values())
            infos = [
                cls._info(s)
                for s in states
                if all(s.metadata.get(k) == v for k, v in wanted.items())
            ]
            return _Paginator(infos[:limit] if limit else infos)

        @staticmethod
        def _info(state: _State) -> Any:
            return e2b.SandboxInfo(
                sandbox_id=state.id, sandbox_domain=None, template_id=state.template, name=None,
                metadata=dict(state.metadata), started_at=state.started_at, end_at=state.end_at,
                state=SandboxState.RUNNING, cpu_count=2, memory_mb=512, envd_version="0.2.0",
            )  # fmt: skip

        @_Dual
        def get_info(cls, sandbox_id, **opts):  # type: ignore[no-untyped-def]
            cls._cloud.check(opts)
            return cls._info(cls._cloud.state(sandbox_id))

        @_Dual
        def kill(cls, sandbox_id, **opts):  # type: ignore[no-untyped-def]
            cls._cloud.check(opts)
            with cls._cloud.lock:
                state = cls._cloud.sandboxes.pop(sandbox_id, None)
            if state is None:
                return False
            state.destroy()
            return True

        @_Dual
        def set_timeout(cls, sandbox_id, timeout, **opts):  # type: ignore[no-untyped-def]
            cls._cloud.check(opts)
            state = cls._cloud.state(sandbox_id)
            state.end_at = datetime.now(UTC) + timedelta(seconds=timeout)

        @_Dual
        def get_metrics(cls, sandbox_id, start=None, end=None, **opts):  # type: ignore[no-untyped-def]
            cls._cloud.check(opts)
            state = cls._cloud.state(sandbox_id)
            used = sum(p.lstat().st_size for p in state.home.rglob("*"))
            return [
                e2b.SandboxMetrics(
                    cpu_count=2, cpu_used_pct=1.5, disk_total=1 << 30, disk_used=used,
                    mem_total=512 << 20, mem_used=64 << 20, mem_cache=0, timestamp=datetime.now(UTC),
                )
            ]  # fmt: skip

        def get_host(self, port: int) -> str:
            # As the SDK does in debug mode: host:port, plain TCP (the fake shares our network).
            return f"127.0.0.1:{port}"

    return FakeSandbox
