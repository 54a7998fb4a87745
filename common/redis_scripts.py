"""Redis commands made on every request (Lua scripts, a few plain reads), encoded here.

redis-py's `Script` encodes EVALSHA's arguments one by one through its general encoder and
goes through the client's generic command path: about 95 µs of CPU for the rate limit's
call with ten arguments, against 58 µs for the same round trip with the command written as
one RESP array by a few lines of formatting (measured in one process, same Redis). An API
key's request makes that call; a metered one makes the usage record's and a read of its
period's counters too.

Over plain TCP (the client's URL `redis://`, no options beyond host, port, database,
credentials and timeouts) the command goes out on a connection of this module's own
(`DirectConnection`): a blocking socket whose timeouts the kernel keeps (SO_SNDTIMEO,
SO_RCVTIMEO), so a round trip is one send and one receive. redis-py's connection, with a
timeout set, polls before each of them, and its pool probes a connection for unread data
before handing it out (two `ioctl`s and a `recv`): seven system calls a round trip, each of
which lets go of the GIL, and in a web process busy with other requests each time it is
taken back is a switch between threads. Whether the server closed a connection while it was
idle is read from the kernel's TCP state instead (a `getsockopt` that keeps the GIL). Any
other client (TLS, a Unix socket, other options) goes through its own pool as before, which
reconnects a connection the server closed before handing it out; either way its timeouts
and credentials hold.

A command is resent only when sending it failed, never after it may have reached Redis: a
script that counts must not count twice.
"""

from __future__ import annotations

import hashlib
import os
import socket
import struct
import threading
import weakref
from collections import deque
from collections.abc import Sequence
from typing import Any

import redis
from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
)

Arg = str | bytes | int | float


def _bulk(value: Arg) -> bytes:
    if isinstance(value, bytes):
        data = value
    elif isinstance(value, str):
        data = value.encode()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        data = repr(value).encode()
    else:
        raise TypeError(f"a Redis argument must be str, bytes, int or float, not {type(value)}")
    return b"$%d\r\n%b\r\n" % (len(data), data)


def resp_command(*args: Arg) -> bytes:
    """One command as the RESP array Redis reads."""
    return b"*%d\r\n%b" % (len(args), b"".join(_bulk(arg) for arg in args))


_shared_clients: dict[str, redis.Redis] = {}


def shared_client(url: str) -> redis.Redis:
    """The process's client for `url`, for short commands that must not hang a request (2 s
    timeouts; plain options, so `command` takes the direct path): the per-process caches of
    API keys, organizations and sandbox rows share it. Two threads racing may each build
    one; either is kept."""
    client = _shared_clients.get(url)
    if client is None:
        client = _shared_clients[url] = redis.Redis.from_url(
            url, socket_timeout=2, socket_connect_timeout=2
        )
    return client


def command(client: redis.Redis, *args: Arg) -> Any:
    """One command (e.g. "MGET", key, ...) on `client`'s pool; Redis's reply as redis-py
    parses it, before any of the client's per-command conversions (bytes, not decoded)."""
    return send(client, resp_command(*args))


def send(client: redis.Redis, command: bytes) -> Any:
    """Send one encoded command to `client`'s Redis and read its reply."""
    direct = direct_connections(client)
    if direct is not None:
        return direct.request(command)
    return _send_pooled(client, command)


def _send_pooled(client: redis.Redis, command: bytes) -> Any:
    """`send` on a connection of `client`'s own pool."""
    pool = client.connection_pool
    connection = pool.get_connection()
    try:
        try:
            connection.send_packed_command([command], check_health=False)
        except (redis.ConnectionError, redis.TimeoutError):
            # Not sent, so nothing happened: once more on a new connection.
            connection.disconnect()
            connection.send_packed_command([command], check_health=False)
        return connection.read_response()
    except (redis.ConnectionError, redis.TimeoutError):
        connection.disconnect()  # its state is unknown: never handed out as it is
        raise
    finally:
        pool.release(connection)


class LuaScript:
    """`source`, run by EVALSHA on `client`'s connection pool (EVAL when Redis has not
    cached it yet: after a restart or SCRIPT FLUSH). Calling it returns Redis's reply as
    redis-py parses it (bytes, not decoded)."""

    def __init__(self, client: redis.Redis, source: str) -> None:
        self.client = client
        self.source = source
        self.sha = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()

    def __call__(self, keys: Sequence[str], args: Sequence[Arg] = ()) -> Any:
        by_sha = resp_command("EVALSHA", self.sha, len(keys), *keys, *args)
        try:
            return send(self.client, by_sha)
        except NoScriptError:
            # EVAL runs the script and caches it, so the next EVALSHA finds it.
            return send(self.client, resp_command("EVAL", self.source, len(keys), *keys, *args))


# The connection options DirectConnection honours; a client with any other is left to redis-py.
_DIRECT_OPTIONS = frozenset(
    {"host", "port", "db", "username", "password", "socket_timeout", "socket_connect_timeout"}
)
_TCP_ESTABLISHED = 1  # the first byte of Linux's struct tcp_info
_ERRORS: dict[str, type[redis.RedisError]] = {
    "NOSCRIPT": NoScriptError,
    "NOAUTH": AuthenticationError,
    "WRONGPASS": AuthenticationError,
    "LOADING": BusyLoadingError,
    "READONLY": ReadOnlyError,
    "OOM": OutOfMemoryError,
}


def _error(message: bytes) -> redis.RedisError:
    """The exception redis-py raises for an error reply (its known codes stripped)."""
    text = message.decode(errors="replace")
    code, _, rest = text.partition(" ")
    kind = _ERRORS.get(code)
    return kind(rest) if kind is not None else ResponseError(text)


def _seconds(value: float) -> bytes:
    """A struct timeval, as SO_RCVTIMEO and SO_SNDTIMEO take it."""
    whole = int(value)
    return struct.pack("ll", whole, int((value - whole) * 1_000_000))


class DirectConnection:
    """One TCP connection to Redis, written and read here (see the module docstring)."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.buffer = bytearray()
        self.start = 0  # where the unread part of `buffer` begins
        address = (options.get("host") or "localhost", int(options.get("port") or 6379))
        try:
            self.sock = socket.create_connection(address, options.get("socket_connect_timeout"))
        except TimeoutError as error:
            raise redis.TimeoutError(f"connecting to Redis at {address}: {error}") from None
        except OSError as error:
            raise redis.ConnectionError(f"connecting to Redis at {address}: {error}") from None
        try:
            self.sock.settimeout(None)  # blocking: no poll before each call
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            timeout = options.get("socket_timeout")
            if timeout:
                for option in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):
                    self.sock.setsockopt(socket.SOL_SOCKET, option, _seconds(timeout))
            if options.get("password") is not None:
                user = options.get("username")
                credentials = (user, options["password"]) if user else (options["password"],)
                self._expect_ok(resp_command("AUTH", *credentials))
            if options.get("db"):
                self._expect_ok(resp_command("SELECT", int(options["db"])))
        except BaseException:
            self.close()
            raise

    def _expect_ok(self, command: bytes) -> None:
        self.send(command)
        reply = self.read_reply()
        if isinstance(reply, redis.RedisError):
            raise reply

    def idle_and_open(self) -> bool:
        """Whether the server still holds this connection open (it may have closed it while
        it sat idle: a restart, CLIENT KILL, its idle timeout)."""
        try:
            state = self.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]
        except OSError:
            return False
        return state == _TCP_ESTABLISHED

    def send(self, command: bytes) -> None:
        try:
            self.sock.sendall(command)
        except BlockingIOError:  # SO_SNDTIMEO passed
            raise redis.TimeoutError("Timeout writing to Redis") from None
        except OSError as error:
            raise redis.ConnectionError(f"Error writing to Redis: {error}") from None

    def _fill(self) -> None:
        if self.start:
            del self.buffer[: self.start]
            self.start = 0
        try:
            data = self.sock.recv(65536)
        except BlockingIOError:  # SO_RCVTIMEO passed
            raise redis.TimeoutError("Timeout reading from Redis") from None
        except OSError as error:
            raise redis.ConnectionError(f"Error reading from Redis: {error}") from None
        if not data:
            raise redis.ConnectionError("Connection closed by server.")
        self.buffer += data

    def _line(self) -> bytes:
        while (end := self.buffer.find(b"\r\n", self.start)) < 0:
            self._fill()
        line = bytes(self.buffer[self.start : end])
        self.start = end + 2
        return line

    def _exactly(self, length: int) -> bytes:
        while len(self.buffer) - self.start < length + 2:
            self._fill()
        data = bytes(self.buffer[self.start : self.start + length])
        self.start += length + 2
        return data

    def read_reply(self) -> Any:
        """One reply as redis-py's RESP2 parser gives it (bytes, not decoded); an error reply
        is returned as its exception, for the caller to raise."""
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b":":
            return int(rest)
        if kind == b"$":
            return None if int(rest) < 0 else self._exactly(int(rest))
        if kind == b"*":
            return None if int(rest) < 0 else [self.read_reply() for _ in range(int(rest))]
        if kind == b"+":
            return rest
        if kind == b"-":
            return _error(rest)
        raise redis.ConnectionError(f"Unexpected reply from Redis: {line[:40]!r}")

    def close(self) -> None:
        self.sock.close()


class DirectConnections:
    """Idle DirectConnections of one client, the most recently used handed out first."""

    KEEP_IDLE = 64

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options
        self.idle: deque[DirectConnection] = deque()

    def _take(self) -> DirectConnection:
        while True:
            try:
                connection = self.idle.pop()
            except IndexError:
                return DirectConnection(self.options)
            if connection.idle_and_open():
                return connection
            connection.close()

    def request(self, command: bytes) -> Any:
        """Send `command` and read its reply (raising an error reply as redis-py does)."""
        connection = self._take()
        try:
            try:
                connection.send(command)
            except (redis.ConnectionError, redis.TimeoutError):
                # Not all of it was sent, and Redis runs no partial command: once more, anew.
                connection.close()
                connection = DirectConnection(self.options)
                connection.send(command)
            reply = connection.read_reply()
        except BaseException:
            connection.close()  # its state is unknown: never handed out as it is
            raise
        if len(self.idle) < self.KEEP_IDLE:
            self.idle.append(connection)
        else:
            connection.close()
        if isinstance(reply, redis.RedisError):
            raise reply
        return reply

    def close(self) -> None:
        while self.idle:
            self.idle.pop().close()


_direct: weakref.WeakKeyDictionary[redis.ConnectionPool, DirectConnections | None] = (
    weakref.WeakKeyDictionary()
)
_direct_lock = threading.Lock()


def direct_connections(client: redis.Redis) -> DirectConnections | None:
    """This module's connections for `client`, or None where its own pool must serve it."""
    pool = client.connection_pool
    try:
        return _direct[pool]
    except KeyError:
        pass
    with _direct_lock:
        if pool not in _direct:
            options = dict(pool.connection_kwargs)
            eligible = (
                type(pool) is redis.ConnectionPool
                and pool.connection_class is redis.Connection
                and set(options) <= _DIRECT_OPTIONS
            )
            _direct[pool] = DirectConnections(options) if eligible else None
        return _direct[pool]


def _forget_in_child() -> None:
    # A forked child must not write on its parent's sockets; it opens its own.
    _direct.clear()


os.register_at_fork(after_in_child=_forget_in_child)
