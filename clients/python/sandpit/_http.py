"""HTTP with the SDK's retry policy, sync and async, and the one place errors are translated.

Retries only where repeating cannot do something twice: reads (GET), and writes that carry
an `Idempotency-Key` (added automatically to every POST, PUT and DELETE; the server replays
the first answer to a repeat and counts it once). A 429 with Retry-After waits what the
server asks, up to `max_retry_wait_s`; connection failures and 502/503/504 back off
exponentially. A body that cannot be re-read (a stream) is never retried.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from ._calls import Call
from .config import Config
from .errors import (
    NotFoundError,
    RequestTimeoutError,
    SandpitConnectionError,
    SandpitError,
    error_from_body,
)

T = TypeVar("T")

USER_AGENT = "sandpit-python/0.1.0"
RETRY_STATUSES = frozenset({409, 429, 502, 503, 504})
WRITE_METHODS = frozenset({"POST", "PUT", "DELETE", "PATCH"})


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 4
    """Tries in all, the first included."""
    backoff_s: float = 0.25
    """First back-off; doubled per attempt, with jitter."""
    max_retry_wait_s: float = 30.0
    """The longest a single Retry-After is honoured; beyond it the error is raised."""


def _retry_after_s(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def raise_for(response: httpx.Response) -> None:
    """Translate an error response into the SDK's exception; success passes."""
    if response.status_code < 400:
        return
    try:
        body = response.json()
    except ValueError:
        body = None
    raise error_from_body(response.status_code, body, retry_after_s=_retry_after_s(response))


def _code_of(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return ""


def _retry_wait_s(
    response: httpx.Response | None, attempt: int, policy: RetryPolicy
) -> float | None:
    """Seconds to wait before trying again, or None when this answer must not be retried."""
    backoff = policy.backoff_s * (2**attempt) * (0.5 + random.random())  # noqa: S311
    if response is None:
        return backoff
    status = response.status_code
    if status not in RETRY_STATUSES:
        return None
    code = _code_of(response)
    if status == 429:
        # Only the rate limiter's 429 passes with time; a quota stays exceeded.
        if code not in ("rate_limited", "throttled", ""):
            return None
        wait = _retry_after_s(response)
        if wait is None:
            return backoff
        return wait if wait <= policy.max_retry_wait_s else None
    if status == 409:
        # The first request with this Idempotency-Key is still running: ask again shortly.
        return backoff if code == "idempotency_in_progress" else None
    if status == 503 and code in ("provider_not_configured",):
        return None
    return backoff


def _request_options(call: Call[Any]) -> dict[str, Any]:
    return {
        "json": call.json,
        "params": call.params,
        "content": call.content,
        "headers": call.headers,
        "timeout_s": call.timeout_s,
    }


class _Base:
    def __init__(self, config: Config, *, timeout_s: float, retry: RetryPolicy) -> None:
        self.config = config
        self.timeout_s = timeout_s
        self.retry = retry
        self.headers = {"Authorization": f"Bearer {config.api_key}", "User-Agent": USER_AGENT}

    def _prepare(
        self, method: str, headers: Mapping[str, str] | None, content: Any
    ) -> tuple[dict[str, str], bool]:
        merged = dict(headers or {})
        if method in WRITE_METHODS and "Idempotency-Key" not in merged:
            merged["Idempotency-Key"] = uuid.uuid4().hex
        replayable = content is None or isinstance(content, bytes | str)
        return merged, replayable

    @property
    def ws_base(self) -> str:
        url = self.config.url
        return "wss" + url[5:] if url.startswith("https") else "ws" + url[4:]


class HttpClient(_Base):
    """Synchronous transport."""

    def __init__(
        self, config: Config, *, timeout_s: float = 60.0, retry: RetryPolicy | None = None
    ):
        super().__init__(config, timeout_s=timeout_s, retry=retry or RetryPolicy())
        self.client = httpx.Client(base_url=config.url, headers=self.headers, timeout=timeout_s)

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        content: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        stream: bool = False,
    ) -> httpx.Response:
        """The response of a successful request (streamed ones open: close them); errors raise."""
        merged, replayable = self._prepare(method, headers, content)
        attempt = 0
        while True:
            try:
                request = self.client.build_request(
                    method,
                    path,
                    json=json,
                    params=params,
                    content=content,
                    headers=merged,
                    timeout=timeout_s if timeout_s is not None else self.timeout_s,
                )
                response = self.client.send(request, stream=stream)
            except httpx.TimeoutException as exc:
                failure: SandpitError = RequestTimeoutError(
                    f"No answer from {self.config.url} in time ({exc}).", code="timeout"
                )
                response = None
            except httpx.TransportError as exc:
                failure = SandpitConnectionError(
                    f"Cannot reach {self.config.url}: {exc}", code="connection_error"
                )
                response = None
            attempt += 1
            wait = _retry_wait_s(response, attempt - 1, self.retry)
            if wait is None or not replayable or attempt >= self.retry.max_attempts:
                if response is None:
                    raise failure
                if response.status_code >= 400:
                    if stream:
                        response.read()
                    raise_for(response)
                return response
            if response is not None:
                response.close()
            time.sleep(wait)

    def call(self, call: Call[T]) -> T:
        """Send `call` and read its answer (see sandpit/_calls.py)."""
        try:
            response = self.request(call.method, call.path, **_request_options(call))
        except NotFoundError as exc:
            if call.missing is None:
                raise
            return call.missing(exc)
        return call.parse(response)

    def close(self) -> None:
        self.client.close()


class AsyncHttpClient(_Base):
    """Asynchronous transport: the same policy on httpx.AsyncClient."""

    def __init__(
        self, config: Config, *, timeout_s: float = 60.0, retry: RetryPolicy | None = None
    ):
        super().__init__(config, timeout_s=timeout_s, retry=retry or RetryPolicy())
        self.client = httpx.AsyncClient(
            base_url=config.url, headers=self.headers, timeout=timeout_s
        )

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        content: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        stream: bool = False,
    ) -> httpx.Response:
        merged, replayable = self._prepare(method, headers, content)
        attempt = 0
        while True:
            try:
                request = self.client.build_request(
                    method,
                    path,
                    json=json,
                    params=params,
                    content=content,
                    headers=merged,
                    timeout=timeout_s if timeout_s is not None else self.timeout_s,
                )
                response = await self.client.send(request, stream=stream)
            except httpx.TimeoutException as exc:
                failure: SandpitError = RequestTimeoutError(
                    f"No answer from {self.config.url} in time ({exc}).", code="timeout"
                )
                response = None
            except httpx.TransportError as exc:
                failure = SandpitConnectionError(
                    f"Cannot reach {self.config.url}: {exc}", code="connection_error"
                )
                response = None
            attempt += 1
            wait = _retry_wait_s(response, attempt - 1, self.retry)
            if wait is None or not replayable or attempt >= self.retry.max_attempts:
                if response is None:
                    raise failure
                if response.status_code >= 400:
                    if stream:
                        await response.aread()
                    raise_for(response)
                return response
            if response is not None:
                await response.aclose()
            await asyncio.sleep(wait)

    async def call(self, call: Call[T]) -> T:
        """Send `call` and read its answer (see sandpit/_calls.py)."""
        try:
            response = await self.request(call.method, call.path, **_request_options(call))
        except NotFoundError as exc:
            if call.missing is None:
                raise
            return call.missing(exc)
        return call.parse(response)

    async def close(self) -> None:
        await self.client.aclose()
