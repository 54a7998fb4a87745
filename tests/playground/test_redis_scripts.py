"""common/redis_scripts.py against the real Redis: the command it writes is the one redis-py
writes, the reply is the one redis-py's Script returns, and a counting script counts once
through lost scripts, dropped connections, a timed-out reply and concurrent callers."""

from __future__ import annotations

import threading
import uuid

import pytest
import redis
from django.conf import settings

from common.redis_scripts import LuaScript, command, resp_command
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


@pytest.fixture
def client():
    if not settings.REDIS_URL:
        missing_part("REDIS_URL is not set")
    client = redis.Redis.from_url(settings.REDIS_URL)
    yield client
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
    pooled = client.connection_pool.get_connection()
    try:
        pooled.send_command("CLIENT", "ID")
        pooled_id = pooled.read_response()
    finally:
        client.connection_pool.release(pooled)
    other = redis.Redis.from_url(settings.REDIS_URL)
    try:
        assert other.client_kill_filter(_id=pooled_id) == 1
    finally:
        other.close()
    assert script(keys=[key]) == 2
    assert int(client.get(key)) == 2


def test_an_error_reply_raises_and_the_connection_stays_usable(client, key):
    failing = LuaScript(client, "return redis.error_reply('refused here')")
    with pytest.raises(redis.ResponseError, match="refused here"):
        failing(keys=[key])
    assert LuaScript(client, COUNT)(keys=[key]) == 1


def test_a_reply_that_times_out_is_not_sent_again(client, key):
    impatient = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=0.1)
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
