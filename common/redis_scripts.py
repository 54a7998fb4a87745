"""Redis commands made on every request (Lua scripts, a few plain reads), encoded here.

redis-py's `Script` encodes EVALSHA's arguments one by one through its general encoder and
goes through the client's generic command path: about 95 µs of CPU for the rate limit's
call with ten arguments, against 58 µs for the same round trip with the command written as
one RESP array by a few lines of formatting (measured in one process, same Redis). An API
key's request makes that call; a metered one makes the usage record's and a read of its
period's counters too.

The connection comes from the client's own pool (which reconnects a connection the server
closed, before handing it out), so the pool's size, timeouts and TLS settings hold. A
command is resent only when sending it failed, never after it may have reached Redis: a
script that counts must not count twice.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import redis
from redis.exceptions import NoScriptError

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


def command(client: redis.Redis, *args: Arg) -> Any:
    """One command (e.g. "MGET", key, ...) on `client`'s pool; Redis's reply as redis-py
    parses it, before any of the client's per-command conversions (bytes, not decoded)."""
    return send(client, resp_command(*args))


def send(client: redis.Redis, command: bytes) -> Any:
    """Send one encoded command on a connection of `client`'s pool and read its reply."""
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
