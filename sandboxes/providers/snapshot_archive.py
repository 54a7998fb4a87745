"""Snapshot archives on the host: a tar stream of a sandbox's /workspace and /tmp, compressed.

Both the local and the docker provider produce the tar stream inside the sandbox's own
isolation (a throwaway bubblewrap jail as the sandbox's uid, or `docker exec` as the
sandbox's user), so reading a snapshot never follows a symbolic link the sandbox planted to
a host file, and restoring one never writes outside the new sandbox. Only the compressed
bytes touch the host: this module pumps the stream into `zstd` (level 1, all cores; plain
tar when zstd is missing) and counts what is stored, stopping at the byte budget.

Archive members are `workspace/...` and `tmp/...` (relative to the sandbox's root);
`tmp/.sandpit` (background command logs of processes a restore does not bring back) is
left out. Setuid and setgid bits are stripped when the archive is written (`--mode`), and
again by an unprivileged GNU tar when it is read back.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import IO

from sandboxes.providers.base import ProviderError, ResourceExhausted, SnapshotResult

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
CHUNK = 1024 * 1024
TAR_CREATE_SCRIPT = (
    "find workspace tmp -mindepth 1 \\( -path tmp/.sandpit -prune \\) -o -print0 | "
    "/usr/bin/tar --create --file=- --null --no-recursion --files-from=- --numeric-owner --sparse "
    "--mode=ug-s --ignore-failed-read --warning=no-file-changed --warning=no-file-ignored"
)
"""`sh -c` this with the sandbox's root as the working directory: the tar stream on stdout.
The two roots themselves are not members, so a restore never changes their owner or mode
(the sandbox cannot chmod /tmp); files the sandbox made unreadable to itself are skipped;
sparse files stay sparse (a 400 MB hole is neither read nor written back as zeros)."""
TAR_CREATE_ARGS = ("/bin/sh", "-c", TAR_CREATE_SCRIPT)
TAR_EXTRACT_ARGS = (
    "/usr/bin/tar",
    "--extract",
    "--file=-",
    "--no-same-owner",
    "--no-same-permissions",
)
"""Run unprivileged: files become the sandbox's own, modes lose setuid/setgid."""


def _zstd() -> str | None:
    return shutil.which("zstd")


def write_archive(chunks: Iterable[bytes], target: Path, max_bytes: int) -> SnapshotResult:
    """Compress `chunks` (a tar stream) into the new file `target` (0600). Raises
    ResourceExhausted once the stored file would pass `max_bytes`, ProviderError when
    zstd fails; `target` is removed on any failure."""
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    content = 0
    zstd = _zstd()
    compressor: subprocess.Popen[bytes] | None = None
    try:
        sink: IO[bytes]
        if zstd is not None:
            compressor = subprocess.Popen(
                [zstd, "-1", "-q", "-T0", "-c"],
                stdin=subprocess.PIPE,
                stdout=fd,
                stderr=subprocess.DEVNULL,
            )
            assert compressor.stdin is not None
            sink = compressor.stdin
        else:
            sink = os.fdopen(os.dup(fd), "wb")
        try:
            for chunk in chunks:
                content += len(chunk)
                sink.write(chunk)
                if os.fstat(fd).st_size > max_bytes:
                    raise ResourceExhausted(_too_large(max_bytes))
        finally:
            try:
                sink.close()
            except BrokenPipeError:
                pass
        if compressor is not None and compressor.wait() != 0:
            raise ProviderError("Compressing the snapshot failed.")
        size = os.fstat(fd).st_size
        if size > max_bytes:
            raise ResourceExhausted(_too_large(max_bytes))
    except BaseException:
        if compressor is not None and compressor.poll() is None:
            compressor.kill()
            compressor.wait()
        target.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)
    return SnapshotResult(location=str(target), size_bytes=size, content_bytes=content)


def _too_large(max_bytes: int) -> str:
    return (
        f"The snapshot would take more than the {max_bytes:,} bytes of snapshot storage "
        "left to this organization. Delete snapshots (or files in the sandbox) and retry."
    )


def file_chunks(stream: IO[bytes]) -> Iterable[bytes]:
    """A readable stream in CHUNK-sized pieces, until its end."""
    while chunk := stream.read(CHUNK):
        yield chunk


def open_archive(location: str) -> subprocess.Popen[bytes] | IO[bytes]:
    """The archive's tar stream: a `zstd -dc` process (read its stdout; wait for it) or,
    for an uncompressed archive, the open file. Raises ProviderError when it is missing."""
    try:
        with open(location, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise ProviderError(f"The snapshot archive cannot be read: {exc.strerror}.") from None
    if magic != ZSTD_MAGIC:
        return open(location, "rb")  # noqa: SIM115 - the caller closes it
    zstd = _zstd()
    if zstd is None:
        raise ProviderError("This snapshot is zstd-compressed and zstd is not installed.")
    return subprocess.Popen(
        [zstd, "-dc", "-q", location], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )


def archive_stdout(source: subprocess.Popen[bytes] | IO[bytes]) -> IO[bytes]:
    """The readable end of what `open_archive` returned."""
    if isinstance(source, subprocess.Popen):
        assert source.stdout is not None
        return source.stdout
    return source


def archive_close(source: subprocess.Popen[bytes] | IO[bytes]) -> bool:
    """Close what `open_archive` returned; False when decompression failed."""
    if isinstance(source, subprocess.Popen):
        if source.stdout is not None:
            source.stdout.close()
        try:
            return source.wait(timeout=10) == 0
        except subprocess.TimeoutExpired:
            source.kill()
            source.wait()
            return False
    source.close()
    return True


def remove_archive(location: str) -> bool:
    """Delete an archive file; False when it was already gone."""
    try:
        os.unlink(location)
    except FileNotFoundError:
        return False
    return True
