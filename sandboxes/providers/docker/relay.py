"""A `docker exec` whose stdin/stdout carry one agent connection, as a plain socket.

How the host reaches a container's agent when it cannot reach its socket (a remote
engine, or gVisor, which does not pass host Unix sockets through bind mounts): the
exec runs the agent's ``--relay`` mode. The exec has no TTY (a TTY would make the
Engine scan our bytes for its detach keys), so the Engine frames its output as
[stream, 0, 0, 0, size] + payload; two threads bridge the exec socket onto one end
of a socketpair, dropping the frame headers, and the caller gets the other end.
"""

from __future__ import annotations

import socket
import struct
import threading
from contextlib import suppress
from typing import Any

FRAME = struct.Struct(">BxxxI")


def raw_socket(stream: Any) -> socket.socket:
    """The OS socket under what exec_start(socket=True) returned."""
    return getattr(stream, "_sock", stream)


class ExecBridge:
    """Bridges an exec's framed output and raw input onto a socketpair."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._raw = raw_socket(stream)
        self._raw.setblocking(True)
        self.sock, inner = socket.socketpair()
        threading.Thread(target=self._demultiplex, args=(inner,), daemon=True).start()
        threading.Thread(target=self._forward, args=(inner,), daemon=True).start()

    def _read_exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self._raw.recv(n - len(data))
            if not chunk:
                return b""
            data += chunk
        return data

    def _demultiplex(self, inner: socket.socket) -> None:
        """Exec output frames -> the socketpair: stdout payloads only.

        Once the caller is gone, output is read to the exec's end and dropped rather than
        the exec closed: what the caller sent just before it went may still be on its way
        in (_forward), and the agent reads it even from a client that has gone."""
        delivering = True
        try:
            while header := self._read_exactly(FRAME.size):
                stream_id, size = FRAME.unpack(header)
                while size:
                    chunk = self._raw.recv(min(size, 65536))
                    if not chunk:
                        return
                    size -= len(chunk)
                    if stream_id == 1 and delivering:
                        try:
                            inner.sendall(chunk)
                        except OSError:
                            delivering = False
        except OSError:
            pass
        finally:
            with suppress(OSError):
                inner.shutdown(socket.SHUT_WR)
            self._close_raw()

    def _forward(self, inner: socket.socket) -> None:
        """The socketpair -> the exec's stdin (not framed); EOF ends the relay's input."""
        try:
            while chunk := inner.recv(65536):
                self._raw.sendall(chunk)
        except OSError:
            pass
        finally:
            with suppress(OSError):
                self._raw.shutdown(socket.SHUT_WR)
            inner.close()

    def _close_raw(self) -> None:
        with suppress(OSError):
            self._raw.close()
        with suppress(Exception):
            self._stream.close()
