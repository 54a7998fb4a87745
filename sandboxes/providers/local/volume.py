"""A size-capped file system per sandbox, so that no sandbox can fill the host's disk.

RLIMIT_FSIZE caps one file; this caps them all. ``root_dir/<id>/vol`` is a
tmpfs of ``resources.disk_mb`` megabytes (and one inode per 8 KiB, so empty
files cannot exhaust kernel memory either) holding ``workspace/``, ``tmp/`` and
``run/``, everything the jail can write (`subdir` finds them; ``root_dir/<id>/workspace``
and the others are links to them, for people and tools). Host-side file operations work
on them, failing with ENOSPC at the cap.

The mount lives in the host's mount namespace, made before the jail starts and lazily
unmounted (MNT_DETACH) when it is destroyed, so a file descriptor still open somewhere
cannot keep the sandbox directory from being removed. One mount per sandbox, not a mount
plus a bind per subdirectory: every new jail's namespace starts as a copy of the host's,
and bwrap re-reads that whole mount table for each of its binds, so each live sandbox's
mounts made every later jail's start dearer (the binds moved into the jail's command line).
As root, bwrap starts through launcher.py's helper, which leaves it only the starting
sandbox's own volume of them all.

Trade-off: tmpfs lives in memory (and swap). Bytes written from inside the
jail are charged to the sandbox's memory cgroup, bytes written host-side to
Sandpit's own; budget ``disk_mb`` of RAM per sandbox at worst. Mounting needs
CAP_SYS_ADMIN (Sandpit running as root); without it `supported()` is False and
sandboxes only have the per-file limit.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
from pathlib import Path

SUBDIRS = ("workspace", "tmp", "run")
BYTES_PER_INODE = 8192
MIN_INODES = 1024

_MS_NOSUID = 0x2
_MS_NODEV = 0x4
_MS_REMOUNT = 0x20
_MS_BIND = 0x1000
_MNT_DETACH = 0x2
_UMOUNT_NOFOLLOW = 0x8

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = (
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_char_p,
)
_libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)
_libc.statfs.argtypes = (ctypes.c_char_p, ctypes.c_void_p)

_TMPFS_MAGIC = 0x01021994
ROOT_SOURCE = "sandpit-jails"
ROOT_SIZE_MB = 256
"""The cap of a jail root held in memory (`root_in_memory`). It holds each jail's directory,
state.json, log and the links to its volume (a few pages each: 256 MiB is tens of thousands
of sandboxes), and the helpers every jail shares (a few MB); never a sandbox's files, which
are on its own volume."""


def _mount(source: str, target: Path, fstype: str | None, flags: int, data: str | None) -> None:
    if (
        _libc.mount(
            source.encode(),
            os.fsencode(target),
            fstype.encode() if fstype else None,
            flags,
            data.encode() if data else None,
        )
        != 0
    ):
        code = ctypes.get_errno()
        raise OSError(code, f"mount {target}: {os.strerror(code)}")


def _umount(target: Path) -> bool:
    """Detach the mount at `target`; False when nothing is mounted there."""
    return _libc.umount2(os.fsencode(target), _MNT_DETACH | _UMOUNT_NOFOLLOW) == 0


def on_tmpfs(path: Path) -> bool:
    """Whether `path` is on a tmpfs (statfs; False when it cannot be read)."""
    buffer = ctypes.create_string_buffer(256)  # struct statfs (120 bytes on 64-bit Linux)
    if _libc.statfs(os.fsencode(path), buffer) != 0:
        return False
    # f_type comes first, a long (__fsword_t).
    return ctypes.c_long.from_buffer(buffer).value == _TMPFS_MAGIC


def root_in_memory(root_dir: Path) -> bool:
    """Mount a tmpfs at `root_dir` if it is empty; whether `root_dir` is on a tmpfs now.

    Making, renaming and removing a jail's directory and writing its state are metadata
    writes, which a disk's file system journals: on ext4 here they were two thirds of the
    ~1.5 ms a warm jail takes to become a sandbox (0.5 ms on a tmpfs), and a slower disk
    would put its latency in every create and destroy. Nothing under the root needs to
    outlive a reboot, which kills every jail anyway.

    Only an empty directory is mounted over (a new installation, or after a reboot emptied
    the one a tmpfs was on): jails or files there belong to processes that would lose them
    from sight. Processes starting at once take a lock on the directory first, so one mounts
    and the others find the tmpfs. The mount stays when the process exits (the other
    processes sharing the root use it); every process that uses the root must share its
    mount namespace, as they already must for the sandboxes' volumes. Needs CAP_SYS_ADMIN;
    without it nothing changes."""
    fd = os.open(root_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if on_tmpfs(root_dir):
            return True
        if os.listdir(root_dir):
            return False
        try:
            _mount(
                ROOT_SOURCE,
                root_dir,
                "tmpfs",
                _MS_NOSUID | _MS_NODEV,
                f"size={ROOT_SIZE_MB}m,mode=0711,uid={os.getuid()},gid={os.getgid()}",
            )
        except OSError:
            return False
        return True
    finally:
        os.close(fd)


def release_root(root_dir: Path) -> bool:
    """Detach the tmpfs `root_in_memory` mounted at `root_dir` (a test's or a benchmark's
    root, before it is removed); False when none is mounted there."""
    if not on_tmpfs(root_dir) or not os.path.ismount(root_dir):
        return False
    return _umount(root_dir)


def supported(probe_dir: Path) -> bool:
    """Whether this process may mount a tmpfs (tried once on `probe_dir`)."""
    probe_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        _mount("sandpit-probe", probe_dir, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=64k")
    except OSError:
        return False
    _umount(probe_dir)
    return True


def create(sandbox_dir: Path, disk_mb: int) -> None:
    """Mount the sandbox's tmpfs and bind its subdirectories in place (~0.1 ms).

    Raises OSError; the caller cleans up with `remove` either way.
    """
    vol = sandbox_dir / "vol"
    vol.mkdir(mode=0o700)
    size, inodes = _options(disk_mb)
    # One source name for every volume: the jail sees it in /proc/mounts, and a warm
    # jail's would otherwise name the pool rather than the sandbox. Passable, not listable,
    # like the sandbox directory: bwrap (as the jail's uid) reaches the subdirectories
    # through it.
    _mount(
        "sandpit",
        vol,
        "tmpfs",
        _MS_NOSUID | _MS_NODEV,
        f"size={size}m,nr_inodes={inodes},mode=0711,uid={os.getuid()},gid={os.getgid()}",
    )
    for sub in SUBDIRS:
        (vol / sub).mkdir(mode=0o755)
        (sandbox_dir / sub).symlink_to(f"vol/{sub}")


def subdir(sandbox_dir: Path, sub: str) -> Path:
    """Where the sandbox's `sub` (one of SUBDIRS) really is: in its volume when it has one
    (also for sandboxes from before the links, whose `sub` was a bind of the same
    directory), else right in `sandbox_dir`."""
    inside = sandbox_dir / "vol" / sub
    return inside if os.path.isdir(inside) else sandbox_dir / sub


def _options(disk_mb: int) -> tuple[int, int]:
    size = max(1, int(disk_mb))
    return size, max(MIN_INODES, size * 1024 * 1024 // BYTES_PER_INODE)


def resize(sandbox_dir: Path, disk_mb: int) -> None:
    """Give the sandbox's tmpfs a new size (a warm jail being claimed; ~20 µs).

    Raises OSError when the volume already holds more than the new size (or more
    files than its inode count); the volume is unchanged then.
    """
    vol = sandbox_dir / "vol"
    size, inodes = _options(disk_mb)
    st = os.statvfs(vol)
    if (st.f_blocks - st.f_bfree) * st.f_frsize > size * 1024 * 1024:
        raise OSError(errno.ENOSPC, f"{vol} holds more than {size} MiB")
    _mount(
        "sandpit",
        vol,
        None,
        _MS_REMOUNT | _MS_NOSUID | _MS_NODEV,
        f"size={size}m,nr_inodes={inodes}",
    )


def remove(sandbox_dir: Path) -> None:
    """Detach every mount `create` made (and the binds of sandboxes made before the links);
    never raises."""
    for sub in (*SUBDIRS, "vol"):
        _umount(sandbox_dir / sub)


def used_bytes(sandbox_dir: Path) -> int | None:
    """Bytes in use on the sandbox's tmpfs, or None when it has none."""
    vol = sandbox_dir / "vol"
    try:
        if os.stat(vol).st_dev == os.stat(sandbox_dir).st_dev:
            return None
        st = os.statvfs(vol)
    except OSError:
        return None
    return (st.f_blocks - st.f_bfree) * st.f_frsize
