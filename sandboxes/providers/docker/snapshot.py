"""Pause, resume and snapshots of docker sandboxes (mixed into DockerProvider).

* Pause is `docker pause` (the engine's cgroup freezer): every process stops, memory stays.
* A snapshot is not `docker commit`: a sandbox's root file system is read-only and what it
  can write, /workspace and /tmp, are tmpfs mounts, which commit (and the engine's archive
  endpoint) do not see. So GNU tar runs inside the container as the sandbox's user
  (`docker exec`), its stream is compressed on the host (snapshot_archive.py), and a new
  sandbox gets the files back from a tar reading that stream inside it, also as the
  sandbox's user, before create returns. A paused sandbox is thawed for the copy (the
  engine refuses exec into a paused container) and paused again after.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

from sandboxes.providers.base import ProviderError, ResourceExhausted, SnapshotResult
from sandboxes.providers.snapshot_archive import (
    CHUNK,
    TAR_CREATE_ARGS,
    TAR_EXTRACT_ARGS,
    archive_close,
    archive_stdout,
    open_archive,
    remove_archive,
    write_archive,
)

from .errors import translate
from .relay import FRAME, raw_socket

_USER = "1000:1000"
_INTERNAL = ["SANDPIT_INTERNAL=1"]
"""Marks the tar as Sandpit's own: process listings (and so the reaper) do not count it."""


class DockerSnapshots:
    """Pause, resume and snapshot for DockerProvider (which supplies `_api` and `_cid`)."""

    def _api(self) -> Any:
        raise NotImplementedError  # DockerProvider's

    def _cid(self, provider_id: str) -> str:
        raise NotImplementedError  # DockerProvider's

    def _paused(self, cid: str) -> bool:
        with translate(cid):
            return bool(self._api().inspect_container(cid)["State"].get("Paused"))

    def pause(self, provider_id: str) -> None:
        """`docker pause`; idempotent."""
        cid = self._cid(provider_id)
        if not self._paused(cid):
            with translate(cid):
                self._api().pause(cid)

    def resume(self, provider_id: str) -> None:
        """`docker unpause`; idempotent."""
        cid = self._cid(provider_id)
        if self._paused(cid):
            with translate(cid):
                self._api().unpause(cid)

    def snapshot(self, provider_id: str, target: str, max_bytes: int) -> SnapshotResult:
        """Archive /workspace and /tmp to `target` with a tar inside the container."""
        cid = self._cid(provider_id)
        api = self._api()
        was_paused = self._paused(cid)
        if was_paused:
            with translate(cid):
                api.unpause(cid)
        try:
            with translate(cid):
                exec_id = api.exec_create(
                    cid, list(TAR_CREATE_ARGS), user=_USER, workdir="/", environment=_INTERNAL
                )["Id"]
                stream = api.exec_start(exec_id, socket=True)
            errors = bytearray()
            raw = raw_socket(stream)
            raw.setblocking(True)
            try:
                result = write_archive(_frames(raw, errors), Path(target), max_bytes)
            finally:
                with suppress(Exception):
                    stream.close()
            code = _exit_code(api, cid, exec_id)
            if code not in (0, 1):  # 1: a file changed while it was read
                remove_archive(result.location)
                detail = bytes(errors)[-600:].decode(errors="replace").strip()
                raise ProviderError(f"The snapshot failed: {detail or f'tar exit {code}'}")
            return result
        finally:
            if was_paused:
                with translate(cid):
                    api.pause(cid)

    def snapshot_remove(self, location: str) -> bool:
        """Delete a snapshot archive; False when it was already gone."""
        return remove_archive(location)

    def _restore_into(self, cid: str, location: str) -> None:
        """Unpack the snapshot at `location` into the new container's /workspace and /tmp
        (as the sandbox's user, so ownership is the sandbox's and setuid bits go).
        Raises ResourceExhausted when it does not fit, ProviderError otherwise."""
        api = self._api()
        source = open_archive(location)
        try:
            with translate(cid):
                exec_id = api.exec_create(
                    cid,
                    [*TAR_EXTRACT_ARGS, "-C", "/"],
                    stdin=True,
                    user=_USER,
                    workdir="/",
                    environment=_INTERNAL,
                )["Id"]
                stream = api.exec_start(exec_id, socket=True)
            raw = raw_socket(stream)
            raw.setblocking(True)
            stderr = bytearray()
            drain = threading.Thread(target=_drain, args=(raw, stderr), daemon=True)
            drain.start()
            data = archive_stdout(source)
            try:
                _feed(raw, data, lambda: _running(api, cid, exec_id))
            except OSError:
                pass  # tar stopped reading (an error, reported below)
            with suppress(OSError):
                raw.shutdown(socket.SHUT_WR)
            drain.join(timeout=600)
            with suppress(Exception):
                stream.close()
            code = _exit_code(api, cid, exec_id)
        finally:
            intact = archive_close(source)
        if code != 0:
            detail = bytes(stderr)[-600:].decode(errors="replace").strip()
            # A full tmpfs, or a file past the container's fsize ulimit (SIGXFSZ: 128 + 25).
            if "No space left" in detail or "Wrote only" in detail or code == 153:
                raise ResourceExhausted(
                    "The snapshot's files do not fit this sandbox's disk: ask for a larger "
                    "resources.disk_mb (/tmp holds at most 64 MiB)."
                )
            raise ProviderError(f"Restoring the snapshot failed: {detail or f'exit {code}'}")
        if not intact:
            raise ProviderError("The snapshot archive is damaged.")


def _feed(raw: socket.socket, data: Any, running: Callable[[], bool]) -> None:
    """Send the archive to tar's stdin until it ends or tar has exited. Once tar is gone
    (a full disk, SIGXFSZ) the engine stops reading the exec's socket without closing it,
    so a blocking send would wait for the connection's own timeout (~100 s here): send
    without blocking and ask the engine whether tar still runs whenever the socket stays
    full for a second."""
    poller = select.poll()
    poller.register(raw, select.POLLOUT)
    while chunk := data.read(CHUNK):
        view = memoryview(chunk)
        while view:
            if not poller.poll(1000):
                if not running():
                    return
                continue
            try:
                view = view[raw.send(view, socket.MSG_DONTWAIT) :]
            except BlockingIOError:
                continue


def _running(api: Any, cid: str, exec_id: str) -> bool:
    with translate(cid):
        return bool(api.exec_inspect(exec_id).get("Running"))


def _exit_code(api: Any, cid: str, exec_id: str) -> int | None:
    """The exec's exit status, once the engine has it (just after its output ends it may
    still say running)."""
    deadline = time.monotonic() + 10
    while True:
        with translate(cid):
            info = api.exec_inspect(exec_id)
        if not info.get("Running") or time.monotonic() > deadline:
            return info.get("ExitCode")
        time.sleep(0.005)


def _frames(raw: socket.socket, stderr: bytearray) -> Iterator[bytes]:
    """The exec's stdout, read from its framed output ([stream, 0, 0, 0, size] + payload)
    in large reads (docker-py's own demultiplexer reads a frame at a time, ~5x slower
    here); stderr (stream 2) is kept in `stderr`."""
    buffer = bytearray()
    while chunk := raw.recv(CHUNK):
        buffer += chunk
        start = 0
        out = bytearray()
        while len(buffer) - start >= FRAME.size:
            stream_id, size = FRAME.unpack_from(buffer, start)
            end = start + FRAME.size + size
            if len(buffer) < end:
                break
            payload = buffer[start + FRAME.size : end]
            if stream_id == 2:
                stderr += payload
            else:
                out += payload
            start = end
        del buffer[:start]
        if out:
            yield bytes(out)


def _drain(raw: socket.socket, stderr: bytearray) -> None:
    """Read the exec's framed output to its end, keeping stderr (stream 2)."""
    try:
        for _ in _frames(raw, stderr):
            pass
    except OSError:
        pass
