"""common/redis_scripts.py against the real Redis: the command it writes is the one redis-py
writes, the reply is the one redis-py's Script returns, and a counting script counts once
through lost scripts, dropped connections, a timed-out reply and concurrent callers, both on
the module's own connections (a plain TCP client) and on a client's own pool (any other)."""

from __future__ import annotations

import os
import socket
import struct
import threading
import uuid

import pytest
import redis
from django.conf import settings

from accounts.throttling import rate_limit_script
from billing.metering import RedisMeter
from common.redis_scripts import (
    LuaScript,
    command,
    direct_connections,
    resp_command,
    shared_client,
)
from tests.requirements import missing_part

COUNT = "return redis.call('INCR', KEYS[1])"
MIXED = "return {1, 'text', false, ARGV[1], KEYS[1], tonumber(ARGV[2]) * 2}"
# Holds the reply back for ARGV[1] µs after counting (blocks Redis that long: keep it short).
COUNT_SLOWLY = """
local value = redis.call('INCR', KEYS[1])
local start = redis.call('TIME')
repeat
  local now = redis.call('TIME')
until (now[1] - start[1]) * 1000000 + (now[2] - start[2]) > tonumber(ARGV[1])
return value
"""


@pytest.fixture(params=["direct", "pooled"])
def options(request):
    """A client's options: none (the module's own connections) or one they do not take, which
    leaves the client to its own pool."""
    if not settings.REDIS_URL:
        missing_part("REDIS_URL is not set")
    return {"client_name": "test-pooled"} if request.param == "pooled" else {}


@pytest.fixture
def client(options):
    client = redis.Redis.from_url(settings.REDIS_URL, **options)
    assert (direct_connections(client) is None) == bool(options)
    yield client
    direct = direct_connections(client)
    if direct is not None:
        direct.close()
    client.close()


@pytest.fixture
def key(client):
    name = f"test-redis-scripts:{uuid.uuid4().hex}"
    yield name
    client.delete(name)


def test_the_command_is_what_redis_py_writes():
    samples = [
        ("EVALSHA", "a" * 40, 2, "k:1", "k:2", -7, 0.1, 3.5e-9, 10**20),
        ("SET", "é ünïcode ✓", b"\x00\r\n$*binary\xff"),
        ("SET", "big", "x" * 200_000),
        ("PING",),
        ("SET", "", b""),
    ]
    packer = redis.Connection()
    for args in samples:
        assert resp_command(*args) == b"".join(packer.pack_command(*args)), args[:2]


def test_other_types_are_refused():
    for bad in (True, None, ["list"], {"a": 1}, object()):
        with pytest.raises(TypeError):
            resp_command("SET", "k", bad)  # type: ignore[arg-type]


def test_the_reply_is_redis_pys(client, key):
    ours = LuaScript(client, MIXED)(keys=[key], args=["é\x00", 21])
    theirs = client.register_script(MIXED)(keys=[key], args=["é\x00", 21])
    assert ours == theirs == [1, b"text", None, "é\x00".encode(), key.encode(), 42]


def test_a_script_redis_lost_is_run_and_cached_again(client, key):
    script = LuaScript(client, COUNT)
    assert script(keys=[key]) == 1
    client.script_flush()  # what a restart does to the script cache
    assert client.script_exists(script.sha) == [False]
    assert script(keys=[key]) == 2
    assert client.script_exists(script.sha) == [True]
    assert script(keys=[key]) == 3


def test_a_connection_the_server_closed_is_replaced_and_counts_once(client, key):
    script = LuaScript(client, COUNT)
    assert script(keys=[key]) == 1
    idle_id = command(client, "CLIENT", "ID")  # the connection the next call takes
    other = redis.Redis.from_url(settings.REDIS_URL)
    try:
        assert other.client_kill_filter(_id=idle_id) == 1
    finally:
        other.close()
    assert script(keys=[key]) == 2
    assert int(client.get(key)) == 2
    assert command(client, "CLIENT", "ID") != idle_id


def test_an_error_reply_raises_and_the_connection_stays_usable(client, key):
    failing = LuaScript(client, "return redis.error_reply('refused here')")
    with pytest.raises(redis.ResponseError, match="refused here"):
        failing(keys=[key])
    assert LuaScript(client, COUNT)(keys=[key]) == 1


# Its script blocks Redis for 0.4 s: side by side, the other variant's 0.1 s client would time
# out connecting, before its script ran.
@pytest.mark.xdist_group("redis-blocking-script")
def test_a_reply_that_times_out_is_not_sent_again(client, key, options):
    impatient = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=0.1, **options)
    try:
        with pytest.raises(redis.TimeoutError):
            LuaScript(impatient, COUNT_SLOWLY)(keys=[key], args=[400_000])
        # A patient client's read waits for the script: it counted once.
        assert int(client.get(key)) == 1
        # The connection that timed out is not reused half-read.
        assert LuaScript(impatient, COUNT)(keys=[key]) == 2
        assert int(impatient.get(key)) == 2
    finally:
        impatient.delete(key)
        impatient.close()


def test_concurrent_callers_count_every_call_once(client, key):
    script = LuaScript(client, COUNT)
    replies: list[int] = []
    lock = threading.Lock()

    def caller() -> None:
        mine = [script(keys=[key]) for _ in range(50)]
        with lock:
            replies.extend(mine)

    threads = [threading.Thread(target=caller) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(replies) == list(range(1, 401))
    assert int(client.get(key)) == 400


def test_a_plain_command_replies_as_redis_py(client, key):
    client.set(key, b"\x00value\r\n")
    missing = f"{key}:missing"
    assert command(client, "MGET", key, missing, key) == client.mget(key, missing, key)
    assert command(client, "MGET", key, missing) == [b"\x00value\r\n", None]
    with pytest.raises(redis.ResponseError):
        command(client, "NO-SUCH-COMMAND")
    assert command(client, "GET", key) == b"\x00value\r\n"  # the connection is still good


NESTED = """
return {1, {2, {'three'}}, redis.error_reply('inner refusal'), string.rep('y', 300000), {}}
"""


def test_nested_replies_errors_inside_them_and_long_ones_are_redis_pys(client, key):
    ours = LuaScript(client, NESTED)(keys=[key])
    theirs = client.register_script(NESTED)(keys=[key])
    assert [type(part) for part in ours] == [type(part) for part in theirs]
    assert str(ours[2]) == str(theirs[2]) == "inner refusal"
    assert isinstance(ours[2], redis.ResponseError)
    assert ours[:2] + ours[3:] == theirs[:2] + theirs[3:]
    assert ours[3] == b"y" * 300_000 and ours[4] == []


def redis_options() -> dict:
    if not settings.REDIS_URL:
        missing_part("REDIS_URL is not set")
    return redis.ConnectionPool.from_url(settings.REDIS_URL).connection_kwargs


def test_only_a_plain_tcp_client_is_served_by_the_modules_own_connections():
    at = redis_options()
    assert direct_connections(redis.Redis.from_url(settings.REDIS_URL)) is not None
    served_by_their_pools = [
        redis.Redis.from_url(f"rediss://{at['host']}:{at['port']}/0"),
        redis.Redis.from_url("unix:///run/redis.sock?db=2"),
        redis.Redis.from_url(settings.REDIS_URL, client_name="named"),
        redis.Redis(connection_pool=redis.BlockingConnectionPool.from_url(settings.REDIS_URL)),
    ]
    for client in served_by_their_pools:
        assert direct_connections(client) is None


def test_the_per_request_clients_of_billing_and_the_rate_limit_take_the_direct_path():
    """An option added to either client would send them back to redis-py's pool, unseen."""
    redis_options()  # needs Redis configured
    meter = RedisMeter(settings.REDIS_URL, prefix="test-direct-path")
    assert direct_connections(meter.client) is not None
    assert direct_connections(rate_limit_script(settings.REDIS_URL).client) is not None
    # ... and the caches' shared client (API keys, organizations, sandbox rows).
    assert direct_connections(shared_client(settings.REDIS_URL)) is not None


class RecordingSocket:
    """A socket that notes the name of each method called on it."""

    def __init__(self, sock: socket.socket, calls: list[str]) -> None:
        self.sock = sock
        self.calls = calls

    def __getattr__(self, name: str):
        self.calls.append(name)
        return getattr(self.sock, name)


def test_a_round_trip_is_one_send_and_one_receive_on_a_blocking_socket():
    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=1.5)
    direct = direct_connections(client)
    assert direct is not None
    try:
        assert command(client, "PING") == b"PONG"
        (connection,) = direct.idle
        # No poll before each call: the kernel keeps the timeouts.
        assert connection.sock.gettimeout() is None
        seconds, micros = struct.unpack(
            "ll", connection.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16)
        )
        assert (seconds, micros) == (1, 500_000)
        calls: list[str] = []
        connection.sock = RecordingSocket(connection.sock, calls)  # type: ignore[assignment]
        assert command(client, "PING") == b"PONG"
        # The TCP state is read (no system call that lets go of the GIL), then one send and
        # one receive.
        assert calls == ["getsockopt", "sendall", "recv"]
    finally:
        direct.close()
        client.close()


def test_a_forked_child_opens_its_own_connection_and_leaves_its_parents_alone():
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        parent_id = command(client, "CLIENT", "ID")
        read_end, write_end = os.pipe()
        child = os.fork()
        if child == 0:  # pragma: no cover - the child reports through the pipe
            try:
                os.write(write_end, str(command(client, "CLIENT", "ID")).encode())
            finally:
                os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end) as pipe:
            child_id = int(pipe.read() or "0")
        os.waitpid(child, 0)
        assert child_id and child_id != parent_id
        assert command(client, "CLIENT", "ID") == parent_id  # the parent's, still open
    finally:
        direct = direct_connections(client)
        assert direct is not None
        direct.close()
        client.close()


def test_credentials_and_the_database_of_the_url_are_used(key):
    at = redis_options()
    admin = redis.Redis.from_url(settings.REDIS_URL)
    user = f"test-redis-scripts-{uuid.uuid4().hex[:12]}"
    admin.acl_setuser(user, enabled=True, passwords=["+right-pw"], keys=["*"], commands=["+@all"])
    try:
        url = f"redis://{user}:right-pw@{at['host']}:{at['port']}/5"
        authorised = redis.Redis.from_url(url)
        assert direct_connections(authorised) is not None
        assert command(authorised, "SET", key, b"in five") == b"OK"
        in_five = redis.Redis.from_url(f"redis://{at['host']}:{at['port']}/5")
        assert in_five.get(key) == b"in five"
        in_five.delete(key)
        refused = redis.Redis.from_url(f"redis://{user}:wrong-pw@{at['host']}:{at['port']}/5")
        with pytest.raises(redis.AuthenticationError):
            command(refused, "GET", key)
    finally:
        admin.acl_deluser(user)
        admin.close()


def test_a_redis_that_is_not_there_is_a_connection_error():
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    absent = redis.Redis.from_url(f"redis://127.0.0.1:{port}/0", socket_connect_timeout=1)
    with pytest.raises(redis.ConnectionError):
        command(absent, "PING")
