"""The jails' /etc: one read-only directory bound whole, instead of one bind per host file.

bwrap re-reads the mount table (/proc/self/mountinfo, which then still lists every mount of
the host, four per live sandbox among them) for each bind it makes. With a bind per /etc
file a jail made ~48 binds, so its set-up took 11 ms of CPU beside 5 ms for a bare
`bwrap ... node -v`, and 22 ms once 100 sandboxes were live: perf put a fifth of a burst's
CPU in show_mountinfo. Here the host files a jail may see (jail.ETC_FILES, nothing else)
are copied into a version directory next to the generated ones (passwd, group, hosts,
hostname; resolv.conf in the variant for jails with network), and that directory is the
jail's /etc, bound once, read-only.

What a jail sees is what the binds showed: each listed entry as the host has it when the
jail starts (a top-level symlink followed, as a bind follows it; symlinks inside the
directories kept, resolved in the jail as they were), with the host's modes. A version is
named by a fingerprint of its sources, so processes sharing the root build the same one.
`current()` re-checks the listed entries themselves on each call (~25 stat calls: a file
replaced or rewritten, a directory whose entries changed) and the whole trees at most every
WALK_S seconds (an edit in place deep inside a directory), and builds a new version when
anything changed; a running jail keeps the version it started with. Versions no jail's
state names are removed when a provider starts.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import stat
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

logger = logging.getLogger(__name__)

PREFIX = "etc-"
PLAIN = "plain"
"""The /etc of a jail without network."""
NETWORK = "net"
"""The same with resolv.conf."""
WALK_S = 5.0
_KEEP_UNUSED_S = 600.0
"""An unused version younger than this survives the start-up clean-up: another process may
have just built it for a jail whose state it has not written yet."""
HOST_ETC = Path("/etc")


class JailEtc:
    """The current /etc version under `shared_dir`, kept in step with the host's files."""

    def __init__(
        self,
        shared_dir: Path,
        names: Iterable[str],
        generated: dict[str, str],
        network_files: dict[str, str],
        host_etc: Path = HOST_ETC,
    ) -> None:
        self.shared_dir = Path(shared_dir)
        self.names = tuple(names)
        self.generated = dict(generated)
        self.network_files = dict(network_files)
        self.host_etc = Path(host_etc)
        # Checked before every jail starts: plain strings, not a Path built per name each time.
        self._top_paths = tuple(os.fspath(self.host_etc / name) for name in self.names)
        self._lock = threading.Lock()
        self._quick: tuple[object, ...] | None = None
        self._walked_at = 0.0
        self._current: Path | None = None
        self.current()

    def current(self, network: bool = False) -> Path:
        """The directory to bind at a jail's /etc (built first when the host changed)."""
        with self._lock:
            quick = self._top_level()
            now = time.monotonic()
            if self._current is None or quick != self._quick or now - self._walked_at > WALK_S:
                self._current = self._version(self._fingerprint())
                self._quick = quick
                self._walked_at = now
            return self._current / (NETWORK if network else PLAIN)

    def remove_unused(self, in_use: set[str]) -> None:
        """Remove the versions other than the current one that no path in `in_use` lies in
        (the /etc of every live jail) and that are old enough (see _KEEP_UNUSED_S)."""
        with self._lock:
            current = self._current.name if self._current is not None else ""
        used = {Path(p).parent.name for p in in_use}
        for entry in self.shared_dir.glob(f"{PREFIX}*"):
            if entry.name in (current, *used):
                continue
            try:
                if time.time() - entry.stat().st_mtime < _KEEP_UNUSED_S:
                    continue
            except OSError:
                continue
            shutil.rmtree(entry, ignore_errors=True)

    # ------------------------------------------------------------------ internals

    def _top_level(self) -> tuple[object, ...]:
        return tuple(_stat_key(path, follow=True) for path in self._top_paths)

    def _fingerprint(self) -> str:
        digest = hashlib.sha256()
        for name in self.names:
            top = self.host_etc / name
            digest.update(f"{name}\0{_stat_key(top, follow=True)}\n".encode())
            if top.is_dir():
                # Strings, not Paths: ~900 entries under this host's /etc (16 -> 7 ms of CPU).
                for dirpath, dirnames, filenames in os.walk(top):
                    dirnames.sort()
                    for entry in sorted([*dirnames, *filenames]):
                        path = os.path.join(dirpath, entry)
                        digest.update(f"{path}\0{_stat_key(path, follow=False)}\n".encode())
        for files in (self.generated, self.network_files):
            for name, text in sorted(files.items()):
                digest.update(f"{name}\0{text}\0".encode())
        return PREFIX + digest.hexdigest()[:16]

    def _version(self, name: str) -> Path:
        target = self.shared_dir / name
        if target.is_dir():
            return target
        tmp = self.shared_dir / f".{name}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        try:
            tmp.mkdir(mode=0o755)
            plain = tmp / PLAIN
            self._build(plain, self.generated)
            self._build(tmp / NETWORK, {**self.generated, **self.network_files})
            try:
                os.rename(tmp, target)
            except OSError:  # another process built the same version meanwhile
                if not target.is_dir():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return target

    def _build(self, etc: Path, generated: dict[str, str]) -> None:
        etc.mkdir(mode=0o755)
        for name in self.names:
            source = self.host_etc / name
            if not source.exists():  # also a dangling symlink, which a bind could not follow
                continue
            dest = etc / name
            dest.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            try:
                if source.is_dir():
                    shutil.copytree(source, dest, symlinks=True)
                else:
                    shutil.copy2(source, dest)
            except (OSError, shutil.Error):
                logger.warning("could not copy %s into the jails' /etc", source, exc_info=True)
        for name, text in generated.items():
            path = etc / name
            path.write_text(text)
            os.chmod(path, 0o644)


def _stat_key(path: str | Path, *, follow: bool) -> tuple[object, ...]:
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except OSError:
        return ()
    link = os.readlink(path) if not follow and stat.S_ISLNK(st.st_mode) else ""
    return (st.st_mode, st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns, st.st_ctime_ns, link)
