"""Per-key API rate limiting.

With Redis (REDIS_URL) the limit is a sliding-window counter kept by one Lua call per request
on a process-wide client: DRF's cache throttle costs two round trips, and under ASGI Django's
cache handle is per request context, so it also opened a new Redis connection every request.
The window is approximated the usual way: the previous fixed window's count, weighted by how
much of it still overlaps the sliding window, plus the current window's count.
The same call can read other keys: authentication confirms a cached API key there
(accounts.keycache) and leaves the verdict on the principal, so a request that an API key
makes costs one Redis round trip for both.
Without Redis (the embedded default) DRF's cache-based throttle runs on the local-memory cache.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import redis
from django.conf import settings
from rest_framework.throttling import SimpleRateThrottle

from common.redis_scripts import LuaScript

from .principal import Principal, RateVerdict

if TYPE_CHECKING:  # rest_framework.views reads the throttle setting, i.e. this module
    from rest_framework.request import Request
    from rest_framework.views import APIView

# KEYS: current window, previous window, then any keys to read in the same round trip (an API
# key's generations, accounts.keycache; other apps' keys, accounts.authentication_reads). ARGV: limit, window seconds, fraction of the current
# window elapsed. Returns {1 if allowed (and counted) else 0, current count, previous count,
# then the value of each key read (nil where absent)}.
_SLIDING_WINDOW_LUA = """
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local previous = tonumber(redis.call('GET', KEYS[2]) or '0')
local allowed = 0
if previous * (1 - tonumber(ARGV[3])) + current < tonumber(ARGV[1]) then
  allowed = 1
  current = current + 1
  redis.call('INCR', KEYS[1])
  redis.call('EXPIRE', KEYS[1], 2 * tonumber(ARGV[2]))
end
local reply = {allowed, current, previous}
for i = 3, #KEYS do
  reply[i + 1] = redis.call('GET', KEYS[i]) or false
end
return reply
"""

_clients: dict[str, LuaScript] = {}
_clients_lock = threading.Lock()


def rate_limit_script(url: str) -> LuaScript:
    """The sliding-window script on one client per Redis URL, shared by the process."""
    script = _clients.get(url)
    if script is None:
        with _clients_lock:
            script = _clients.get(url)
            if script is None:
                client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
                script = _clients[url] = LuaScript(client, _SLIDING_WINDOW_LUA)
    return script


def _seconds_until_admitted(
    limit: int, window: float, elapsed: float, current: int, previous: int
) -> float:
    """When the weighted estimate first drops below `limit`, assuming no more requests."""
    if current < limit and previous:
        # Still this window: previous * (1 - e) + current < limit once e passes this point.
        admit_at = 1 - (limit - current) / previous
        return max(0.0, (admit_at - elapsed) * window)
    # This window alone is full: wait for the next one, then for `current` to decay.
    return (1 - elapsed) * window + max(0.0, 1 - limit / max(1, current)) * window


class PerKeyRateThrottle(SimpleRateThrottle):
    """One bucket per API key, sandbox token or user; anonymous callers per IP."""

    scope = "per_key"
    # Set by SimpleRateThrottle.__init__ from the rate (the stubs leave them out); read only
    # when a rate is configured, so ints.
    num_requests: int
    duration: int
    _wait: float

    def get_cache_key(self, request: Request, view: APIView) -> str | None:
        auth = getattr(request, "auth", None)
        if isinstance(auth, Principal):
            if auth.api_key is not None:
                return self.key_bucket(auth.api_key.pk)
            elif auth.token is not None:
                return self.token_bucket(auth.token.token_id)
            elif auth.user is not None:
                return self.user_bucket(auth.user.pk)
            else:
                ident = "user:none"
        else:
            ident = f"ip:{self.get_ident(request)}"
        return self.cache_format % {"scope": self.scope, "ident": ident}

    def key_bucket(self, api_key_id: int) -> str:
        """The bucket of an API key's requests."""
        return self.cache_format % {"scope": self.scope, "ident": f"key:{api_key_id}"}

    def token_bucket(self, token_id: str) -> str:
        """The bucket of a sandbox token's requests."""
        return self.cache_format % {"scope": self.scope, "ident": f"tok:{token_id}"}

    def user_bucket(self, user_id: int) -> str:
        """The bucket of a signed-in user's requests (a browser session's)."""
        return self.cache_format % {"scope": self.scope, "ident": f"user:{user_id}"}

    def counts_in_redis(self) -> bool:
        """Whether allow_request counts in Redis (a rate is set and REDIS_URL is)."""
        return bool(settings.REDIS_URL) and self.rate is not None

    def count(self, bucket: str, *, read: Sequence[str] = ()) -> tuple[RateVerdict, list[Any]]:
        """Count one request in `bucket` (in Redis; see counts_in_redis) and, in the same
        round trip, read the values of the keys `read` (None where absent)."""
        now = time.time()
        window = self.duration
        index = math.floor(now / window)
        elapsed = (now - index * window) / window
        prefix = f"{settings.CACHES['default'].get('KEY_PREFIX') or 'sandpit'}:{bucket}"
        allowed, current, previous, *values = rate_limit_script(settings.REDIS_URL)(
            keys=[f"{prefix}:{index}", f"{prefix}:{index - 1}", *read],
            args=[self.num_requests, window, f"{elapsed:.6f}"],
        )
        values += [None] * (len(read) - len(values))  # trailing nils may be left off
        if allowed:
            return RateVerdict(bucket, True), values
        wait = _seconds_until_admitted(
            self.num_requests, window, elapsed, int(current), int(previous)
        )
        return RateVerdict(bucket, False, wait), values

    def allow_request(self, request: Request, view: APIView) -> bool:
        if not self.counts_in_redis():
            return super().allow_request(request, view)
        key = self.get_cache_key(request, view)
        if key is None:
            return True
        auth = getattr(request, "auth", None)
        verdict = auth.rate if isinstance(auth, Principal) else None
        if verdict is None or verdict.bucket != key:
            verdict, _ = self.count(key)
        if verdict.allowed:
            return True
        self._wait = verdict.wait_s if verdict.wait_s is not None else 0.0
        return False

    def wait(self) -> float | None:
        if getattr(self, "_wait", None) is not None:
            return self._wait
        return super().wait()
