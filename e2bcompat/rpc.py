"""What the Connect RPC services share: who calls, and Sandpit's errors as Connect codes."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from channels.db import database_sync_to_async
from connectrpc.code import Code
from connectrpc.codec import Codec, proto_binary_codec, proto_json_codec
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext

from accounts.authentication import Principal
from accounts.throttling import PerKeyRateThrottle
from common import database_errors
from common.coded import CodedError
from sandboxes.caller import Caller
from sandboxes.models import Sandbox
from sandboxes.providers.base import FileConflict

from .auth import E2BAuthFailed, envd_sandbox, principal_from_headers

T = TypeVar("T")

_STATUS_CODES = {
    400: Code.INVALID_ARGUMENT,
    401: Code.UNAUTHENTICATED,
    402: Code.PERMISSION_DENIED,
    403: Code.PERMISSION_DENIED,
    404: Code.NOT_FOUND,
    409: Code.FAILED_PRECONDITION,
    413: Code.RESOURCE_EXHAUSTED,
    429: Code.RESOURCE_EXHAUSTED,
    501: Code.UNIMPLEMENTED,
    507: Code.RESOURCE_EXHAUSTED,
}


def connect_error(exc: Exception) -> ConnectError:
    """Sandpit's error as the Connect error the SDK maps to its own exceptions. A sandbox
    that is gone or not running answers UNAVAILABLE '... was not found', which the SDK
    reads as SandboxNotRunningException."""
    if isinstance(exc, ConnectError):
        return exc
    if isinstance(exc, FileConflict):
        return ConnectError(Code.ALREADY_EXISTS, exc.message)
    if database_errors.database_unavailable(exc):
        return ConnectError(Code.UNAVAILABLE, database_errors.MESSAGE)
    if not isinstance(exc, CodedError):
        raise exc
    code, status, message = exc.code, exc.status_code, exc.message
    if code in ("sandbox_not_running", "sandbox_gone") or status == 410:
        return ConnectError(Code.UNAVAILABLE, f"The sandbox was not found: {message}")
    return ConnectError(_STATUS_CODES.get(status, Code.UNAVAILABLE), message)


class ClientMessageCodec:
    """A codec whose undecodable request is the client's INVALID_ARGUMENT (HTTP 400), where
    connectrpc answers UNKNOWN (HTTP 500, the server's fault) for whatever its codec raises:
    a string where an object goes, a negative uint32, a float pid, bytes that are not JSON."""

    def __init__(self, codec: Codec[Any, Any]) -> None:
        self.codec = codec

    def name(self) -> str:
        return self.codec.name()

    def encode(self, message: Any) -> bytes:
        return self.codec.encode(message)

    def decode(self, data: bytes | bytearray, message_class: type[T]) -> T:
        try:
            return self.codec.decode(data, message_class)
        except ConnectError:
            raise
        # Whatever the parser raises (ValueError, TypeError, RecursionError for deep
        # nesting...): decoding reads only the client's bytes.
        except Exception as exc:  # noqa: BLE001
            raise ConnectError(
                Code.INVALID_ARGUMENT,
                f"cannot read the {message_class.__name__} message: {exc}",
            ) from None


def request_codecs() -> list[Codec[Any, Any]]:
    """connectrpc's two codecs (binary and JSON protobuf), refusing what they cannot read."""
    return [ClientMessageCodec(proto_binary_codec()), ClientMessageCodec(proto_json_codec())]


class _RpcRequest:
    """What PerKeyRateThrottle reads of a request: who made it (a Principal here, so it
    never falls back to the client address)."""

    def __init__(self, principal: Principal) -> None:
        self.auth = principal
        self.META: dict[str, str] = {}


def rate_limit_wait(principal: Principal, throttle: PerKeyRateThrottle) -> float | None:
    """Count one request in the caller's bucket, the one Sandpit's REST API (and E2B's
    control plane) counts in, unless authentication counted it already; None when allowed,
    else the seconds to wait."""
    # No DRF request or view here: the throttle reads only .auth and .META (see _RpcRequest).
    if throttle.allow_request(_RpcRequest(principal), None):  # type: ignore[arg-type]
        return None
    return float(throttle.wait() or 0)


def _envd_request(headers: dict[str, str]) -> tuple[Principal, Sandbox]:
    throttle = PerKeyRateThrottle()
    principal = principal_from_headers(
        headers, method="POST", throttle=throttle if throttle.counts_in_redis() else None
    )
    wait_s = rate_limit_wait(principal, throttle)
    if wait_s is not None:
        raise ConnectError(
            Code.RESOURCE_EXHAUSTED,
            f"Request was throttled. Expected available in {math.ceil(wait_s)} seconds.",
        )
    return envd_sandbox(headers, principal=principal)


async def envd_caller(ctx: RequestContext[Any, Any]) -> tuple[Caller, Sandbox]:
    """The Caller and sandbox of an RPC: the same per-key rate limit (RESOURCE_EXHAUSTED,
    which the SDK raises as RateLimitException) and tenancy selector as Sandpit's own API
    (another organization's sandbox: NOT_FOUND)."""
    headers = {k.lower(): v for k, v in ctx.request_headers.items()}
    try:
        principal, sandbox = await database_sync_to_async(_envd_request)(headers)
    except E2BAuthFailed as exc:
        raise ConnectError(Code.UNAUTHENTICATED, str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - connect_error re-raises what is not ours to map
        raise connect_error(exc) from None
    return Caller(principal), sandbox


async def call(fn: Callable[..., T], /, **kwargs: Any) -> T:
    """A synchronous service in the ORM thread, its errors as Connect errors."""
    return await guarded(database_sync_to_async(fn)(**kwargs))


async def guarded(awaitable: Awaitable[T]) -> T:
    """Sandpit's errors, and a database that could not serve, as Connect errors (UNAVAILABLE
    for the latter: the SDK retries); anything else propagates (connectrpc: INTERNAL)."""
    try:
        return await awaitable
    except Exception as exc:  # noqa: BLE001 - connect_error re-raises what is not ours to map
        raise connect_error(exc) from None


async def within_deadline(
    ctx: RequestContext[Any, Any], stream: AsyncIterator[T], *, grace_s: float = 0.0
) -> AsyncIterator[T]:
    """`stream`'s messages until the client's deadline (Connect-Timeout-Ms) passes, then
    DEADLINE_EXCEEDED, as envd ends such a stream (connectrpc leaves deadlines to the
    service). The stream is closed on the way out: a PTY or a command goes on, detached.
    `grace_s`: for a stream whose own end comes at the deadline (a command killed by its
    timeout), so that its end event is not cut off."""
    if ctx.timeout_ms is None:
        async for message in stream:
            yield message
        return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ctx.timeout_ms / 1000 + grace_s
    try:
        while True:
            try:
                message = await asyncio.wait_for(anext(stream), deadline - loop.time())
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise ConnectError(
                    Code.DEADLINE_EXCEEDED, "The request's deadline passed."
                ) from None
            yield message
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()
