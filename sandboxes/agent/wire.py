"""The agent's half of its protocol: JSON lines, exact reads, and the one error type.

A request is one JSON line; a reply is one JSON line (``{"ok": true, ...}`` or
``{"ok": false, "error": code, "message": ...}``), sometimes followed by raw bytes.
"""

from __future__ import annotations

# The C module: `import socket` costs each agent start ~6 ms of CPU (enum, selectors,
# collections), and the agent needs none of what the Python layer adds but accept() (see
# `accept` below). The agent's modules take `socket` from here.
import _socket as socket
import errno

# typing costs the agent's start-up ~5 ms: imported for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

try:  # the C halves of json: `import json` would cost ~5 ms of start-up (re, enum)
    import _json

    class _JsonContext:
        strict = True
        object_hook = None
        object_pairs_hook = None
        parse_float = float
        parse_int = int
        memo: dict = {}

        @staticmethod
        def parse_constant(name: str) -> float:
            return float(name)

    # typeshed types the context as a scanner; any object with the decoder's attributes works.
    _scan = _json.make_scanner(_JsonContext())  # type: ignore[arg-type]

    def _no_default(obj: object) -> object:
        raise TypeError(f"cannot encode {type(obj).__name__}")

    _encode = _json.make_encoder(
        None, _no_default, _json.encode_basestring_ascii, None, ": ", ", ", False, False, True
    )

    def json_loads(text: str) -> Any:
        return _scan(text, 0)[0]

    def json_dumps(obj: object) -> str:
        return "".join(_encode(obj, 0))

except (ImportError, AttributeError, TypeError):  # another Python: take the slow path
    import json

    def json_loads(text: str) -> Any:
        return json.loads(text)

    json_dumps = json.dumps


def accept(server: socket.socket) -> socket.socket:
    """The next connection on `server`. The C socket has no public accept: `_accept`, which
    returns the new descriptor, is what the socket module's accept wraps. An interpreter
    without it (a template's own Python) takes the socket module's, paying its import."""
    take = getattr(server, "_accept", None)
    if take is not None:
        return socket.socket(fileno=take()[0])
    import socket as with_python_layer  # noqa: PLC0415 - only where _accept is missing

    wrapper = with_python_layer.socket(fileno=server.fileno())
    try:
        conn, _ = wrapper.accept()
    finally:
        wrapper.detach()  # the listening descriptor stays `server`'s
    return socket.socket(fileno=conn.detach())


MAX_LINE = 1 << 20
CHUNK = 65536
OS_CODES = {
    errno.ENOENT: "file_not_found",
    errno.ENOTDIR: "file_conflict",
    errno.EISDIR: "file_conflict",
    errno.EEXIST: "file_conflict",
    errno.ENOTEMPTY: "file_conflict",
    errno.EBUSY: "file_conflict",
    errno.EINVAL: "file_conflict",
    errno.ENOSPC: "resource_exhausted",
    errno.EDQUOT: "resource_exhausted",
    errno.EFBIG: "resource_exhausted",
    errno.EACCES: "path_not_allowed",
    errno.EPERM: "path_not_allowed",
    errno.ELOOP: "path_not_allowed",
    errno.ENAMETOOLONG: "path_not_allowed",
}
"""OSError numbers -> the provider error codes the host maps to its exceptions."""


class AgentError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise AgentError("invalid_request", "connection closed early")
        buf += chunk
    return bytes(buf)


def send_line(conn: socket.socket, obj: dict) -> None:
    conn.sendall(json_dumps(obj).encode() + b"\n")


def read_line(conn: socket.socket) -> tuple[bytes, bytes]:
    buf = b""
    while b"\n" not in buf:
        chunk = conn.recv(CHUNK)
        if not chunk:
            raise AgentError("invalid_request", "no request")
        buf += chunk
        if len(buf) > MAX_LINE:
            raise AgentError("invalid_request", "request line too long")
    line, _, rest = buf.partition(b"\n")
    return line, rest


def try_send(conn: socket.socket, obj: dict) -> None:
    try:
        send_line(conn, obj)
    except OSError:
        pass
