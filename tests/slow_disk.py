"""A slow disk for tests: a FUSE mount of a directory whose every write waits.

    python -m tests.slow_disk BACKING MOUNTPOINT DELAY_FILE

serves BACKING at MOUNTPOINT; each operation that changes the disk (write, fsync, create,
unlink, rename, mkdir, truncate, ...) first sleeps for the milliseconds DELAY_FILE holds
(read at each operation, so a test can slow the disk down once its server is up). Reads,
lookups and stats are not slowed: a disk's cache serves those. The same files are reachable
at full speed through BACKING, which is how a test prepares them before slowing the disk.

`slow_disk(directory)` mounts one under `directory` and unmounts it on the way out."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.requirements import missing_part, require_module


def _serve(backing: str, mountpoint: str, delay_file: str) -> None:
    import mfusepy as fuse

    root = os.path.realpath(backing)

    def real(path: str) -> str:
        return root + path

    def wait() -> None:
        try:
            delay_ms = float(Path(delay_file).read_text() or 0)
        except (OSError, ValueError):
            delay_ms = 0.0
        if delay_ms > 0:
            time.sleep(delay_ms / 1000)

    stat_fields = ("st_atime_ns", "st_ctime_ns", "st_gid", "st_mode", "st_mtime_ns")
    statfs_fields = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree")

    class SlowWrites(fuse.Operations):  # type: ignore[misc]
        use_ns = True

        def getattr(self, path: str, fh: int | None = None) -> dict[str, int]:
            st = os.lstat(real(path))
            fields = (*stat_fields, "st_nlink", "st_size", "st_uid")
            return {name: getattr(st, name) for name in fields}

        def access(self, path: str, amode: int) -> None:
            if not os.access(real(path), amode):
                raise fuse.FuseOSError(errno.EACCES)

        def readdir(self, path: str, fh: int) -> list[str]:
            return [".", "..", *os.listdir(real(path))]

        def readlink(self, path: str) -> str:
            return os.readlink(real(path))

        def statfs(self, path: str) -> dict[str, int]:
            st = os.statvfs(real(path))
            fields = (*statfs_fields, "f_files", "f_flag", "f_frsize", "f_namemax")
            return {name: getattr(st, name) for name in fields}

        def open(self, path: str, flags: int) -> int:
            if flags & (os.O_TRUNC | os.O_CREAT):
                wait()
            return os.open(real(path), flags)

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            return os.pread(fh, size, offset)

        def release(self, path: str, fh: int) -> int:
            os.close(fh)
            return 0

        def flush(self, path: str, fh: int) -> int:
            return 0

        # Everything below changes the disk, and waits first.
        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            wait()
            return os.pwrite(fh, data, offset)

        def fsync(self, path: str, datasync: int, fh: int) -> int:
            wait()
            os.fsync(fh)
            return 0

        def create(self, path: str, mode: int, fi: Any = None) -> int:
            wait()
            return os.open(real(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)

        def truncate(self, path: str, length: int, fh: int | None = None) -> None:
            wait()
            os.truncate(real(path) if fh is None else fh, length)

        def unlink(self, path: str) -> None:
            wait()
            os.unlink(real(path))

        def rename(self, old: str, new: str) -> None:
            wait()
            os.rename(real(old), real(new))

        def mkdir(self, path: str, mode: int) -> None:
            wait()
            os.mkdir(real(path), mode)

        def rmdir(self, path: str) -> None:
            wait()
            os.rmdir(real(path))

        def mknod(self, path: str, mode: int, dev: int) -> None:
            wait()
            os.mknod(real(path), mode, dev)

        def symlink(self, target: str, source: str) -> None:
            wait()
            os.symlink(source, real(target))

        def link(self, target: str, source: str) -> None:
            wait()
            os.link(real(source), real(target))

        def chmod(self, path: str, mode: int) -> None:
            wait()
            os.chmod(real(path), mode)

        def chown(self, path: str, uid: int, gid: int) -> None:
            wait()
            os.lchown(real(path), uid, gid)

        def utimens(self, path: str, times: tuple[int, int] | None = None) -> None:
            wait()
            os.utime(real(path), ns=times)

    # allow_other: the jails' uids reach what lies under the mount (a tmpfs of jail roots).
    fuse.FUSE(SlowWrites(), mountpoint, foreground=True, allow_other=True, default_permissions=True)


@dataclass
class SlowDisk:
    mount: Path
    """Where the product reads and writes: every change waits."""
    backing: Path
    """The same files at full speed, to prepare them."""
    delay_file: Path

    def set_delay_ms(self, delay_ms: float) -> None:
        self.delay_file.write_text(str(delay_ms))


@contextmanager
def slow_disk(directory: Path, delay_ms: float = 0) -> Iterator[SlowDisk]:
    """A slow disk mounted at `directory`/mount (root only: FUSE's allow_other)."""
    require_module("mfusepy", "mfusepy (dev extra) serves the slow disk")
    if os.geteuid() != 0 or not Path("/dev/fuse").exists() or not shutil.which("fusermount3"):
        missing_part("a slow disk needs root, /dev/fuse and fusermount3 (Debian's fuse3)")
    disk = SlowDisk(directory / "mount", directory / "backing", directory / "delay-ms")
    disk.mount.mkdir(parents=True)
    disk.backing.mkdir(parents=True)
    disk.set_delay_ms(delay_ms)
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.slow_disk", disk.backing, disk.mount, disk.delay_file],
        cwd=Path(__file__).resolve().parents[1],
        stdout=subprocess.DEVNULL,
        stderr=(directory / "fuse.log").open("wb"),
    )
    try:
        deadline = time.monotonic() + 20
        while not os.path.ismount(disk.mount):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((directory / "fuse.log").read_text()[-2000:])
            time.sleep(0.05)
        yield disk
    finally:
        disk.set_delay_ms(0)
        # Lazily: mounts the product made under it (a tmpfs of jails) go with it.
        subprocess.run(["fusermount3", "-u", "-z", str(disk.mount)], check=False)
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


if __name__ == "__main__":
    _serve(*sys.argv[1:4])
