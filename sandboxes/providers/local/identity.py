"""Which host uid each local sandbox runs as.

bwrap maps the sandbox's uid 1000 onto the uid that starts it. Started by a root
server, that was host uid 0: capabilities were dropped, but every check that only
compares uids (``/proc/sys`` files, files owned by root) saw root. So a root server
starts each jail as a host uid of its own, taken from a reserved range
(``SANDPIT_LOCAL_UID_BASE`` .. ``+ SANDPIT_LOCAL_UID_COUNT``): no sandbox is ever host
root, and two sandboxes are two different host users, so neither can signal, trace
or read the other's files even if it reached them. The uid doubles as the gid.

Uids need no /etc/passwd entry. A uid is taken by creating ``<lock_dir>/<uid>`` with
O_EXCL (atomic across every process and provider root on the host) and given back when the jail
is torn down, after its processes are dead. A server that is not root cannot switch
uids; its jails run as its own (unprivileged) uid.
"""

from __future__ import annotations

import contextlib
import os
import zlib
from pathlib import Path

from sandboxes.providers.base import ResourceExhausted

DEFAULT_UID_LOCK_DIR = "/run/sandpit/local-uids"
"""Where taken uids are recorded: one place per host (every provider root, every process),
on a tmpfs that a reboot empties when no jail can be alive."""


class HostIdentities:
    """Allocator of host uids for jails (one uid per live jail)."""

    def __init__(self, lock_dir: Path, base: int, count: int) -> None:
        if base < 1 or count < 1:
            raise ValueError("the uid range must be positive and non-empty")
        self.lock_dir = Path(lock_dir)
        self.base = int(base)
        self.count = int(count)
        self.switching = os.geteuid() == 0
        if self.switching:
            self.lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)

    def contains(self, uid: int) -> bool:
        return self.base <= uid < self.base + self.count

    def acquire(self, owner: str) -> int:
        """A free host uid for the jail `owner` (its directory name, for operators).

        The search starts at a hash of `owner`, so concurrent creates rarely collide.
        Raises ResourceExhausted when every uid of the range is taken.
        """
        if not self.switching:
            return os.geteuid()
        start = zlib.crc32(owner.encode()) % self.count
        for step in range(self.count):
            uid = self.base + (start + step) % self.count
            try:
                self._take(uid, owner.encode())
            except FileExistsError:
                continue
            return uid
        raise ResourceExhausted(
            f"all {self.count} sandbox host uids are in use (SANDPIT_LOCAL_UID_COUNT)"
        )

    def adopt(self, old_dir: Path) -> None:
        """Take over the locks of another lock directory (an earlier version's, under a
        provider root), then remove it."""
        if not self.switching or not old_dir.is_dir():
            return
        for lock in old_dir.iterdir():
            # Another process starting at the same moment may adopt the same locks.
            with contextlib.suppress(FileExistsError, FileNotFoundError):
                if lock.name.isdigit():
                    self._take(int(lock.name), lock.read_bytes())
                lock.unlink()
        with contextlib.suppress(OSError):
            old_dir.rmdir()

    def _take(self, uid: int, owner: bytes) -> None:
        """Record `uid` as taken (FileExistsError when it already is)."""
        fd = os.open(
            self.lock_dir / str(uid), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600
        )
        try:
            os.write(fd, owner)
        finally:
            os.close(fd)

    def release(self, uid: int) -> None:
        """Give `uid` back; only once nothing runs as it any more."""
        if not self.switching or not self.contains(uid):
            return
        try:
            os.unlink(self.lock_dir / str(uid))
        except FileNotFoundError:
            pass
