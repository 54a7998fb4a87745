"""Throttling of password guesses, password-reset mails and signups.

Counters live in Django's cache: Redis when REDIS_URL is set (shared by every web process), the
local-memory cache in the embedded mode. A counter is a key incremented atomically (`add` then
`incr`), forgotten after `forget_s` without a new attempt; past `free` attempts every further one
starts a delay that doubles each time, capped at `max_delay_s`, during which the action is refused
without being counted (so refused guesses do not lengthen the wait).

Login (see `accounts.backends`) keeps three counters of failures:
- per account and client address: the delay that a guesser from one address meets first;
- per client address: stops one address trying a few passwords on many accounts;
- per account: stops guessing from many addresses. So that an attacker cannot keep the owner
  out with it, a browser that has logged in to the account before carries a signed cookie
  (`KNOWN_BROWSER_COOKIE`) that exempts it from this counter (but not from the other two).
Nothing locks forever: the longest refusal is `max_delay_s`, and counters are forgotten.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass

from django.core import signing
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse

# Tests rebind this so that counters of one test never leak into another through Redis.
NAMESPACE = "auth-attempts"


def _clock() -> float:
    """Seconds since the epoch; a function so that tests can move time."""
    return time.time()


@dataclass(frozen=True)
class Limit:
    scope: str
    """Name of the counter family, part of the cache key."""
    free: int
    """Attempts allowed before any delay."""
    max_delay_s: int
    """Longest refusal after one more attempt past `free` (delays double: 1 s, 2 s, 4 s, ...)."""
    forget_s: int
    """The counter is dropped this long after its last attempt."""


LOGIN_PER_ACCOUNT_AND_ADDRESS = Limit("login-pair", free=5, max_delay_s=15 * 60, forget_s=3600)
LOGIN_PER_ADDRESS = Limit("login-ip", free=50, max_delay_s=15 * 60, forget_s=3600)
LOGIN_PER_ACCOUNT = Limit("login-account", free=20, max_delay_s=15 * 60, forget_s=3600)
# Mails to one address: past this, the page answers as usual but no mail is sent.
RESET_PER_EMAIL = Limit("reset-email", free=3, max_delay_s=3600, forget_s=3600)
RESET_PER_ADDRESS = Limit("reset-ip", free=10, max_delay_s=15 * 60, forget_s=3600)
SIGNUP_PER_EMAIL = Limit("signup-email", free=3, max_delay_s=3600, forget_s=3600)
SIGNUP_PER_ADDRESS = Limit("signup-ip", free=10, max_delay_s=15 * 60, forget_s=3600)

KNOWN_BROWSER_COOKIE = "sandpit_known"
_KNOWN_BROWSER_SALT = "accounts.attempts.known-browser"
_KNOWN_BROWSER_MAX_AGE_S = 180 * 24 * 3600


def _keys(limit: Limit, ident: str) -> tuple[str, str]:
    digest = hashlib.sha256(ident.encode()).hexdigest()[:32]
    base = f"{NAMESPACE}:{limit.scope}:{digest}"
    return f"{base}:n", f"{base}:until"


def wait_s(limit: Limit, ident: str) -> int:
    """Seconds until `ident` may try again under `limit` (0: now)."""
    _, until_key = _keys(limit, ident)
    until = cache.get(until_key)
    if until is None:
        return 0
    return max(0, math.ceil(float(until) - _clock()))


def record(limit: Limit, ident: str) -> int:
    """Count one attempt; past `limit.free`, start the next delay. Returns the new count."""
    count_key, until_key = _keys(limit, ident)
    cache.add(count_key, 0, timeout=limit.forget_s)
    try:
        count = cache.incr(count_key)
    except ValueError:  # expired between add and incr
        cache.set(count_key, 1, timeout=limit.forget_s)
        count = 1
    cache.touch(count_key, timeout=limit.forget_s)
    if count > limit.free:
        delay = min(limit.max_delay_s, 2 ** min(count - limit.free - 1, 30))
        # The stored time decides; the entry itself lives as long as the counter.
        cache.set(until_key, _clock() + delay, timeout=limit.forget_s)
    return count


def reset(limit: Limit, ident: str) -> None:
    cache.delete_many(list(_keys(limit, ident)))


def client_address(request: HttpRequest) -> str:
    """The peer address. Behind a proxy, the server must be told to trust it (daphne
    --proxy-headers, as the production image does), or every client shares the proxy's."""
    return str(request.META.get("REMOTE_ADDR") or "unknown")


def _email_ident(email: str) -> str:
    return email.strip().lower()


# --- login ------------------------------------------------------------------------------------


def login_wait_s(request: HttpRequest, email: str) -> int:
    """Seconds before this client may try a password for `email` again (0: now)."""
    email = _email_ident(email)
    address = client_address(request)
    waits = [
        wait_s(LOGIN_PER_ACCOUNT_AND_ADDRESS, f"{email}|{address}"),
        wait_s(LOGIN_PER_ADDRESS, address),
    ]
    if not is_known_browser(request, email):
        waits.append(wait_s(LOGIN_PER_ACCOUNT, email))
    return max(waits)


def login_failed(request: HttpRequest, email: str) -> None:
    email = _email_ident(email)
    address = client_address(request)
    record(LOGIN_PER_ACCOUNT_AND_ADDRESS, f"{email}|{address}")
    record(LOGIN_PER_ADDRESS, address)
    record(LOGIN_PER_ACCOUNT, email)


def login_succeeded(request: HttpRequest, email: str) -> None:
    """Forget the account's failures. The address's own count stays: logging in to one's own
    account must not reset a sprayer's budget."""
    email = _email_ident(email)
    reset(LOGIN_PER_ACCOUNT_AND_ADDRESS, f"{email}|{client_address(request)}")
    reset(LOGIN_PER_ACCOUNT, email)


def _known_browser_tag(email: str) -> str:
    return hashlib.sha256(_email_ident(email).encode()).hexdigest()[:16]


def is_known_browser(request: HttpRequest, email: str) -> bool:
    value = request.COOKIES.get(KNOWN_BROWSER_COOKIE)
    if not value:
        return False
    try:
        tags = signing.loads(value, salt=_KNOWN_BROWSER_SALT, max_age=_KNOWN_BROWSER_MAX_AGE_S)
    except signing.BadSignature:
        return False
    return isinstance(tags, list) and _known_browser_tag(email) in tags


def remember_browser(request: HttpRequest, response: HttpResponse, email: str) -> None:
    """Mark this browser as one that has logged in to `email` (a few accounts at most)."""
    tags: list[str] = []
    value = request.COOKIES.get(KNOWN_BROWSER_COOKIE)
    if value:
        try:
            loaded = signing.loads(value, salt=_KNOWN_BROWSER_SALT)
            if isinstance(loaded, list):
                tags = [str(tag) for tag in loaded]
        except signing.BadSignature:
            pass
    tag = _known_browser_tag(email)
    tags = [tag, *[t for t in tags if t != tag]][:5]
    response.set_cookie(
        KNOWN_BROWSER_COOKIE,
        signing.dumps(tags, salt=_KNOWN_BROWSER_SALT),
        max_age=_KNOWN_BROWSER_MAX_AGE_S,
        httponly=True,
        secure=request.is_secure(),
        samesite="Lax",
    )


# --- mails and signups ------------------------------------------------------------------------


def mail_request_allowed(
    request: HttpRequest, email: str, *, per_email: Limit, per_address: Limit
) -> tuple[bool, int]:
    """Count a request that mails `email` (a signup or password reset).

    Returns (send, refuse_s): refuse_s > 0 means the client address is over its limit and the
    request must be refused; send is False when the address may go on but `email` has had enough
    mail for now (the page must answer as if it was sent, not to tell anything about the address).
    """
    address = client_address(request)
    refuse = wait_s(per_address, address)
    if refuse:
        return False, refuse
    record(per_address, address)
    ident = _email_ident(email)
    if wait_s(per_email, ident):
        return False, 0
    record(per_email, ident)
    return True, 0
