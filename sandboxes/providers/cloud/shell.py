"""The shared layer for cloud adapters whose SDK gives us one primitive: run a shell script.

An adapter implements lifecycle plus `_shell(provider_id, script, timeout_s) -> (stdout,
exit_code)`. Everything else is built here from POSIX tools inside the sandbox:

- exec: the command runs under `timeout -k 1 T` (which kills its process group) with stdout
  and stderr captured to temporary files and printed back base64-framed, so the two
  streams stay apart and binary-safe even where the SDK merges or decodes output.
  A command killed by a signal reports 128+N here (what `timeout` passes on), not -N.
- files: read/write through base64; list/stat with `find -printf`; a `realpath -m` check
  keeps symlinks from leading outside the workspace.

Processes, terminals, ports, watch and stats are not offered by this layer: they raise
CapabilityNotSupported (501) unless an adapter overrides them.
"""

from __future__ import annotations

import base64
import math
import posixpath
import shlex
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from sandboxes.providers.base import (
    Capability,
    ExecRequest,
    ExecResult,
    FileConflict,
    FileEntry,
    FileEvent,
    FileNotFound,
    OpenPort,
    PathNotAllowed,
    PortStream,
    ProcessInfo,
    ProviderError,
    PtySession,
    SandboxStats,
)
from sandboxes.providers.cloud.common import (
    WorkspacePaths,
    check_env,
    command_line,
    not_supported,
)

_NOT_FOUND, _CONFLICT = 44, 45
_WRITE_CHUNK = 48 * 1024
"""Raw bytes per write call (64 KiB of base64), well under the kernel's 128 KiB per argument."""
_HELPER_TIMEOUT_S = 60.0
_FIND_FORMAT = r"%y\t%s\t%T@\t%p\n"
_TYPES = {"f": "file", "d": "dir", "l": "symlink"}

# $1 cwd, $2 timeout, $3 cap, $4 command; stdin (base64) in $5 when present.
_FRAMED = r"""
o=$(mktemp) && e=$(mktemp) || exit 70
cd "$1" || exit 71
if [ -n "$5" ]; then
  printf %s "$5" | base64 -d | timeout -k 1 "$2" sh -c "$4" >"$o" 2>"$e"
else
  timeout -k 1 "$2" sh -c "$4" >"$o" 2>"$e" </dev/null
fi
c=$?
head -c "$3" "$o" | base64 | tr -d '\n'; echo
head -c "$3" "$e" | base64 | tr -d '\n'; echo
echo "$c $(wc -c <"$o") $(wc -c <"$e")"
rm -f "$o" "$e"
"""


class ShellCloudProvider:
    """Files and exec for any sandbox that can run `sh`; see the module doc."""

    name = "shell"
    capabilities = frozenset({Capability.EXEC, Capability.FILES})
    workspace = "/workspace"

    def __init__(self) -> None:
        self._paths = WorkspacePaths(self.workspace)

    # -- the one primitive ----------------------------------------------------------

    def _shell(self, provider_id: str, script: str, timeout_s: float) -> tuple[bytes, int]:
        """Run `script` with sh inside the sandbox: (stdout, exit code). Raises ProviderError."""
        raise NotImplementedError

    def _call(self, provider_id: str, script: str, *args: str, timeout_s: float) -> str:
        line = shlex.join(["sh", "-c", script, "sh", *args])
        out, code = self._shell(provider_id, line, timeout_s)
        text = out.decode(errors="replace")
        if code == _NOT_FOUND:
            raise FileNotFound(text.strip() or "No such file or directory.")
        if code == _CONFLICT:
            raise FileConflict(text.strip() or "The path conflicts with an existing entry.")
        if code != 0:
            raise ProviderError(f"{self.name}: helper command failed with {code}: {text[-300:]}")
        return text

    # -- execution ------------------------------------------------------------------

    def exec(self, provider_id: str, request: ExecRequest) -> ExecResult:
        cwd = self._paths.cwd(request.cwd)
        env = check_env(request.env)
        command = command_line(request)
        if env:
            command = (
                f"export {' '.join(shlex.quote(f'{k}={v}') for k, v in env.items())}; {command}"
            )
        timeout = max(1, math.ceil(request.timeout_s))
        stdin = base64.b64encode(request.stdin).decode() if request.stdin else ""
        started = time.monotonic()
        text = self._call(
            provider_id,
            _FRAMED,
            cwd,
            str(timeout),
            str(request.max_output_bytes),
            command,
            stdin,
            timeout_s=timeout + 15,
        )
        lines = text.split("\n")
        if len(lines) < 3:
            raise ProviderError(f"{self.name}: unexpected exec output {text[-200:]!r}")
        code, out_size, err_size = (int(x) for x in lines[2].split())
        timed_out = code == 124
        return ExecResult(
            stdout=base64.b64decode(lines[0]),
            stderr=base64.b64decode(lines[1]),
            exit_code=-9 if timed_out else code,
            duration_ms=(time.monotonic() - started) * 1000.0,
            timed_out=timed_out,
            stdout_truncated=out_size > request.max_output_bytes,
            stderr_truncated=err_size > request.max_output_bytes,
        )

    # -- files ----------------------------------------------------------------------

    def _real(self, provider_id: str, path: str, follow_last: bool = True) -> str:
        lexical = self._paths.resolve(path)
        if lexical == self._paths.root:
            return lexical
        target = lexical if follow_last else posixpath.dirname(lexical)
        real = self._call(
            provider_id, 'realpath -m -- "$1"', target, timeout_s=_HELPER_TIMEOUT_S
        ).strip()
        if not self._paths.inside(real):
            raise PathNotAllowed(f"'{path}' leads outside the workspace through a symlink.")
        return real if follow_last else posixpath.join(real, posixpath.basename(lexical))

    def _entries(self, text: str, real_base: str, lexical_base: str) -> list[FileEntry]:
        entries = []
        for line in text.splitlines():
            kind, size, mtime, path = line.split("\t", 3)
            shown = posixpath.normpath(
                posixpath.join(lexical_base, posixpath.relpath(path, real_base))
            )
            entries.append(
                FileEntry(
                    name=posixpath.basename(shown),
                    path=self._paths.relative(shown),
                    type=_TYPES.get(kind, "file"),
                    size=int(size),
                    mtime=float(mtime),
                )
            )
        return entries

    def _stat_real(self, provider_id: str, real: str, lexical: str) -> FileEntry:
        text = self._call(
            provider_id,
            f'[ -e "$1" ] || [ -L "$1" ] || {{ echo "no such file: $1"; exit {_NOT_FOUND}; }}; '
            f"find \"$1\" -maxdepth 0 -printf '{_FIND_FORMAT}'",
            real,
            timeout_s=_HELPER_TIMEOUT_S,
        )
        return self._entries(text, real, lexical)[0]

    def read_file(
        self, provider_id: str, path: str, offset: int = 0, length: int | None = None
    ) -> bytes:
        real = self._real(provider_id, path)
        count = "" if length is None else f" | head -c {int(length)}"
        text = self._call(
            provider_id,
            f'[ -e "$1" ] || {{ echo "no such file: $1"; exit {_NOT_FOUND}; }}; '
            f'[ -d "$1" ] && {{ echo "is a directory: $1"; exit {_CONFLICT}; }}; '
            f'tail -c +$(($2 + 1)) "$1"{count} | base64 | tr -d "\\n"',
            real,
            str(int(offset)),
            timeout_s=_HELPER_TIMEOUT_S,
        )
        return base64.b64decode(text.strip())

    def write_file(self, provider_id: str, path: str, data: bytes) -> FileEntry:
        real = self._real(provider_id, path)
        first = True
        for i in range(0, max(len(data), 1), _WRITE_CHUNK):
            chunk = base64.b64encode(data[i : i + _WRITE_CHUNK]).decode()
            redirect = ">" if first else ">>"
            self._call(
                provider_id,
                f'mkdir -p "$(dirname "$1")" && printf %s "$2" | base64 -d {redirect} "$1"',
                real,
                chunk,
                timeout_s=_HELPER_TIMEOUT_S,
            )
            first = False
        return self._stat_real(provider_id, real, self._paths.resolve(path))

    def mkdir(self, provider_id: str, path: str) -> FileEntry:
        real = self._real(provider_id, path)
        self._call(
            provider_id,
            f'[ -e "$1" ] && [ ! -d "$1" ] && {{ echo "not a directory: $1"; exit {_CONFLICT}; }}; '
            'mkdir -p "$1"',
            real,
            timeout_s=_HELPER_TIMEOUT_S,
        )
        return self._stat_real(provider_id, real, self._paths.resolve(path))

    def list_files(self, provider_id: str, path: str, recursive: bool = False) -> list[FileEntry]:
        real = self._real(provider_id, path)
        depth = "" if recursive else "-maxdepth 1"
        text = self._call(
            provider_id,
            f'[ -e "$1" ] || {{ echo "no such directory: $1"; exit {_NOT_FOUND}; }}; '
            f'[ -d "$1" ] || {{ echo "not a directory: $1"; exit {_CONFLICT}; }}; '
            f"find \"$1\" -mindepth 1 {depth} -printf '{_FIND_FORMAT}'",
            real,
            timeout_s=_HELPER_TIMEOUT_S,
        )
        entries = self._entries(text, real, self._paths.resolve(path))
        return sorted(entries, key=lambda e: e.path)

    def stat(self, provider_id: str, path: str) -> FileEntry:
        real = self._real(provider_id, path, follow_last=False)
        return self._stat_real(provider_id, real, self._paths.resolve(path))

    def exists(self, provider_id: str, path: str) -> bool:
        real = self._real(provider_id, path, follow_last=False)
        text = self._call(
            provider_id,
            'if [ -e "$1" ] || [ -L "$1" ]; then echo yes; else echo no; fi',
            real,
            timeout_s=_HELPER_TIMEOUT_S,
        )
        return text.strip() == "yes"

    def remove(self, provider_id: str, path: str, recursive: bool = False) -> None:
        real = self._real(provider_id, path, follow_last=False)
        if real == self._paths.root:
            raise PathNotAllowed("The workspace itself cannot be removed.")
        rm = 'rm -rf -- "$1"' if recursive else (
            'if [ -d "$1" ] && [ ! -L "$1" ]; then rmdir -- "$1" 2>/dev/null || '
            f'{{ echo "directory not empty: $1"; exit {_CONFLICT}; }}; else rm -f -- "$1"; fi'
        )  # fmt: skip
        self._call(
            provider_id,
            f'[ -e "$1" ] || [ -L "$1" ] || {{ echo "no such file: $1"; exit {_NOT_FOUND}; }}; {rm}',
            real,
            timeout_s=_HELPER_TIMEOUT_S,
        )

    def move(self, provider_id: str, src: str, dst: str) -> FileEntry:
        real_src = self._real(provider_id, src, follow_last=False)
        real_dst = self._real(provider_id, dst, follow_last=False)
        self._call(
            provider_id,
            f'[ -e "$1" ] || [ -L "$1" ] || {{ echo "no such file: $1"; exit {_NOT_FOUND}; }}; '
            'mkdir -p "$(dirname "$2")" && mv -T -- "$1" "$2"',
            real_src,
            real_dst,
            timeout_s=_HELPER_TIMEOUT_S,
        )
        return self._stat_real(provider_id, real_dst, self._paths.resolve(dst))

    # -- not offered by this layer ------------------------------------------------------

    def set_timeout(self, provider_id: str, timeout_s: int) -> None:
        raise not_supported(self.name, "changing the timeout of a running sandbox")

    def stats(self, provider_id: str) -> SandboxStats:
        raise not_supported(self.name, "sandbox stats")

    def start_process(
        self,
        provider_id: str,
        command: str,
        args: Sequence[str] | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ProcessInfo:
        raise not_supported(self.name, "background processes")

    def list_processes(self, provider_id: str) -> list[ProcessInfo]:
        raise not_supported(self.name, "background processes")

    def signal_process(self, provider_id: str, pid: int, signal: int) -> None:
        raise not_supported(self.name, "background processes")

    def open_pty(
        self,
        provider_id: str,
        cols: int = 80,
        rows: int = 24,
        shell: str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> PtySession:
        raise not_supported(self.name, "terminals")

    def open_ports(self, provider_id: str) -> list[OpenPort]:
        raise not_supported(self.name, "port previews")

    def connect_port(self, provider_id: str, port: int) -> PortStream:
        raise not_supported(self.name, "port previews")

    def watch(
        self, provider_id: str, path: str, recursive: bool = True
    ) -> Iterator[list[FileEvent]]:
        raise not_supported(self.name, "watching files")


def label_filter(labels: Any, installation: str) -> bool:
    """Whether a provider-side label/tag mapping marks a sandbox of this installation."""
    return bool(labels) and dict(labels).get("sandpit.installation") == installation
