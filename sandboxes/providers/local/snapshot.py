"""Pause, resume and snapshots of local jails (mixed into LocalProvider).

* Pause: every jail sits in a freezer cgroup of its own from its first instruction
  (jail_cgroups.py creates it with the others; on cgroup v2 it is the jail's one cgroup, frozen
  through cgroup.freeze), so writing FROZEN there stops every process of the sandbox at
  once, forks in flight included; memory stays as it is.
  Destroying a paused jail thaws it after the SIGKILLs (a frozen task cannot die).
* Snapshot: a tar of the jail's /workspace and /tmp (everything it can write besides the
  agent's socket directory), made by GNU tar in a throwaway bubblewrap jail that runs as
  the sandbox's own host uid and sees only those two directories, read-only. So however
  the sandbox arranges its links, the archive holds nothing the sandbox could not read
  itself. A running sandbox is frozen for the moment of the copy, so the copy is
  consistent (as after a power cut); a paused one stays paused.
* Restore: before the new jail's first process starts, the same kind of throwaway jail,
  as the new sandbox's host uid with only its two directories writable, unpacks the
  archive. Files come out owned by the new uid whatever the archive says, setuid and
  setgid bits are dropped (unprivileged GNU tar), and a last host-side walk clears any
  that remain; links stay links, resolved later as the jail sees them.
"""

from __future__ import annotations

import os
import stat
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from sandboxes.providers.base import (
    CapabilityNotSupported,
    ProviderError,
    ResourceExhausted,
    SandboxGone,
    SnapshotResult,
)
from sandboxes.providers.local import jail, volume
from sandboxes.providers.snapshot_archive import (
    TAR_CREATE_ARGS,
    TAR_EXTRACT_ARGS,
    archive_close,
    archive_stdout,
    file_chunks,
    open_archive,
    remove_archive,
    write_archive,
)

FREEZE_TIMEOUT_S = 10.0
TAR_TIMEOUT_S = 900.0
FROZEN = "FROZEN"
THAWED = "THAWED"
_VIEW = "/snapshot"
"""Where the throwaway jail sees the sandbox's two directories."""


# --- the freezer -------------------------------------------------------------------------


def freezer_state(path: str) -> str:
    """FROZEN, FREEZING or THAWED ('' when the cgroup is gone), on v1 or v2."""
    if os.path.exists(f"{path}/freezer.state"):
        return (jail.read_text(f"{path}/freezer.state") or "").strip()
    asked = (jail.read_text(f"{path}/cgroup.freeze") or "").strip()
    if not asked:
        return ""
    frozen = "frozen 1" in (jail.read_text(f"{path}/cgroup.events") or "").splitlines()
    if asked == "1":
        return FROZEN if frozen else "FREEZING"
    return "FREEZING" if frozen else THAWED  # thawing: not running yet


def _freezer_write(path: str, target: str) -> None:
    """Ask the kernel for `target` (FROZEN or THAWED): v1's freezer.state, v2's cgroup.freeze."""
    if os.path.exists(f"{path}/freezer.state"):
        name, value = "freezer.state", target
    else:
        name, value = "cgroup.freeze", "1" if target == FROZEN else "0"
    with open(f"{path}/{name}", "w") as f:
        f.write(value)


def freezer_set(path: str, target: str) -> None:
    """Write `target` to the freezer and wait until the kernel reports it (freezing a
    task in the middle of a system call can take a moment). Raises ProviderError."""
    deadline = time.monotonic() + FREEZE_TIMEOUT_S
    delay = 0.0005
    while True:
        try:
            _freezer_write(path, target)
        except OSError as exc:
            raise ProviderError(f"Cannot write the sandbox's freezer: {exc.strerror}") from None
        if freezer_state(path) == target:
            return
        if time.monotonic() > deadline:
            raise ProviderError(f"The sandbox's processes did not become {target.lower()}.")
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def jail_frozen(state: jail.JailState) -> bool:
    """Whether the jail is paused (its freezer cgroup frozen or freezing)."""
    path = state.cgroups.get("freezer")
    return path is not None and freezer_state(path) in (FROZEN, "FREEZING")


def cgroups_thaw(cgroups: dict[str, str]) -> None:
    """Thaw the jail's freezer cgroup if it has one (teardown: after the SIGKILLs, so
    frozen tasks can die). Never raises."""
    path = cgroups.get("freezer")
    if path is not None and os.path.isdir(path):
        try:
            _freezer_write(path, THAWED)
        except OSError:
            pass


# --- the throwaway tar jail ----------------------------------------------------------------


def tar_jail_argv(
    bwrap: str, sandbox_dir: Path, *, writable: bool, tar_args: tuple[str, ...]
) -> list[str]:
    """bwrap running `tar_args` (GNU tar) with only the sandbox's workspace and tmp mounted, at
    /snapshot/workspace and /snapshot/tmp (read-only unless `writable`), as uid 1000
    inside (the caller starts it as the sandbox's host uid), no network, no capability."""
    bind = "--bind" if writable else "--ro-bind"
    args = [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--uid",
        str(jail.SANDBOX_UID),
        "--gid",
        str(jail.SANDBOX_UID),
        "--disable-userns",
        "--cap-drop",
        "ALL",
        "--die-with-parent",
        "--new-session",
        "--ro-bind",
        "/usr",
        "/usr",
    ]
    for top in ("bin", "lib", "lib64"):
        host = f"/{top}"
        if os.path.islink(host):
            args += ["--symlink", os.readlink(host), host]
        elif os.path.isdir(host):
            args += ["--ro-bind", host, host]
    args += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        bind,
        str(volume.subdir(sandbox_dir, "workspace")),
        f"{_VIEW}/workspace",
        bind,
        str(volume.subdir(sandbox_dir, "tmp")),
        f"{_VIEW}/tmp",
        "--chdir",
        _VIEW,
        "--clearenv",
        "--setenv",
        "LANG",
        "C.UTF-8",
        *tar_args,
    ]
    return args


def _as_uid(host_uid: int) -> dict[str, Any]:
    """Popen arguments that run the child as `host_uid` (no supplementary groups)."""
    if host_uid < 0 or host_uid == os.geteuid():
        return {}
    return {"user": host_uid, "group": host_uid, "extra_groups": []}


def _tail(log: IO[bytes]) -> str:
    log.seek(0)
    return log.read()[-600:].decode(errors="replace").strip()


def restore_files(bwrap: str, location: str, sandbox_dir: Path, host_uid: int) -> None:
    """Unpack the snapshot at `location` into `sandbox_dir`'s workspace and tmp, which no
    process of the sandbox uses yet. Raises ResourceExhausted when it does not fit the
    sandbox's disk, ProviderError when the archive is damaged or missing."""
    source = open_archive(location)
    with tempfile.TemporaryFile() as log:
        try:
            proc = subprocess.Popen(
                tar_jail_argv(bwrap, sandbox_dir, writable=True, tar_args=TAR_EXTRACT_ARGS),
                stdin=archive_stdout(source),
                stdout=subprocess.DEVNULL,
                stderr=log,
                **_as_uid(host_uid),
            )
        except OSError as exc:
            archive_close(source)
            raise ProviderError(f"Cannot start the restore: {exc.strerror}") from None
        try:
            code = proc.wait(timeout=TAR_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = -9
        intact = archive_close(source)
        if code != 0:
            detail = _tail(log)
            if any(sign in detail for sign in ("No space left", "Disk quota", "Wrote only")):
                raise ResourceExhausted(
                    "The snapshot's files do not fit this sandbox's disk: ask for a larger "
                    "resources.disk_mb."
                )
            raise ProviderError(f"Restoring the snapshot failed: {detail or f'exit {code}'}")
        if not intact:
            raise ProviderError("The snapshot archive is damaged.")
    _drop_setid_bits(sandbox_dir)


def _drop_setid_bits(sandbox_dir: Path) -> None:
    """Clear setuid/setgid on every regular file restored (unprivileged tar already did;
    this holds even for an archive written by other means). Nothing of the sandbox runs
    yet, so the walk races nobody; links are never followed."""
    for sub in ("workspace", "tmp"):
        for directory, _dirs, files in os.walk(volume.subdir(sandbox_dir, sub)):
            for name in files:
                path = os.path.join(directory, name)
                info = os.lstat(path)
                if stat.S_ISREG(info.st_mode) and info.st_mode & (stat.S_ISUID | stat.S_ISGID):
                    os.chmod(path, stat.S_IMODE(info.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))


# --- the provider's methods ---------------------------------------------------------------------


class LocalSnapshots:
    """Pause, resume and snapshot for LocalProvider (which supplies the state lookups)."""

    bwrap_path: str

    def _state(self, provider_id: str) -> tuple[Path, jail.JailState]:
        raise NotImplementedError  # LocalProvider's

    def _freezer(self, provider_id: str) -> tuple[Path, jail.JailState, str]:
        sdir, state = self._state(provider_id)
        if not jail.jail_alive(state):
            raise SandboxGone(f"Sandbox {provider_id} is not running.")
        path = state.cgroups.get("freezer")
        if path is None:
            raise CapabilityNotSupported(
                "This sandbox has no freezer cgroup (it started before pause existed, or the "
                "host has no freezer cgroup for Sandpit): it cannot be paused."
            )
        return sdir, state, path

    def pause(self, provider_id: str) -> None:
        """Freeze every process of the jail (cgroup freezer); memory stays. Idempotent."""
        _, _, path = self._freezer(provider_id)
        freezer_set(path, FROZEN)

    def resume(self, provider_id: str) -> None:
        """Thaw the jail's processes. Idempotent."""
        _, _, path = self._freezer(provider_id)
        freezer_set(path, THAWED)

    def snapshot(self, provider_id: str, target: str, max_bytes: int) -> SnapshotResult:
        """Archive the jail's /workspace and /tmp to `target` (see the module docstring).
        A running jail is frozen for the copy and thawed after; a paused one stays so."""
        sdir, state, path = self._freezer(provider_id)
        froze = freezer_state(path) != FROZEN
        if froze:
            freezer_set(path, FROZEN)
        try:
            return self._archive(sdir, state.host_uid, Path(target), max_bytes)
        finally:
            if froze:
                freezer_set(path, THAWED)

    def snapshot_remove(self, location: str) -> bool:
        """Delete a snapshot archive; False when it was already gone."""
        return remove_archive(location)

    def _archive(self, sdir: Path, host_uid: int, target: Path, max_bytes: int) -> SnapshotResult:
        with tempfile.TemporaryFile() as log:
            try:
                proc = subprocess.Popen(
                    tar_jail_argv(self.bwrap_path, sdir, writable=False, tar_args=TAR_CREATE_ARGS),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    **_as_uid(host_uid),
                )
            except OSError as exc:
                raise ProviderError(f"Cannot start the snapshot: {exc.strerror}") from None
            assert proc.stdout is not None
            try:
                result = write_archive(file_chunks(proc.stdout), target, max_bytes)
            except BaseException:
                proc.kill()
                proc.wait()
                raise
            finally:
                proc.stdout.close()
            code = proc.wait(timeout=TAR_TIMEOUT_S)
            if code not in (0, 1):  # 1: a file changed while read (a thawed /tmp writer)
                remove_archive(result.location)
                raise ProviderError(f"The snapshot failed: {_tail(log) or f'tar exit {code}'}")
        return result
