"""One exception tree for the whole SDK, translated from the server's error body in one place.

Every API error is `{"error": {"code", "message"}}` with a fitting HTTP status; WebSocket
errors are `{"type": "error", "code", "message", "status"?}` messages. `error_from()` turns
either into the class of the code's family, so callers catch families, not codes.
"""

from __future__ import annotations

from typing import Any


class SandpitError(Exception):
    """Base of every error the SDK raises."""

    def __init__(self, message: str, *, code: str = "error", status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        """Human-readable, from the server where it came from the server."""
        self.code = code
        """The server's machine-readable code (e.g. `sandbox_not_found`)."""
        self.status = status
        """HTTP status, or the status a WebSocket error message carried; None for client-side."""

    def __str__(self) -> str:
        return f"{self.message} ({self.code})"


class AuthError(SandpitError):
    """No, invalid, revoked or insufficient credentials (401, 403)."""


class NotFoundError(SandpitError):
    """No such sandbox, file, process or terminal in your organization (404, 410)."""


class LimitError(SandpitError):
    """A limit or quota: too many sandboxes or terminals, a file too large, disk full."""


class PaymentRequiredError(SandpitError):
    """Billing refused the operation (402): free allowance used, premium feature, cap reached."""


class RateLimitError(SandpitError):
    """Too many requests (429 rate_limited), after the SDK's own bounded retries."""

    def __init__(
        self,
        message: str,
        *,
        code: str = "rate_limited",
        status: int | None = 429,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message, code=code, status=status)
        self.retry_after_s = retry_after_s
        """What the server's Retry-After asked for, in seconds."""


class SandboxError(SandpitError):
    """The sandbox or its provider failed or cannot do this (not running, 5xx, 501)."""


class RequestTimeoutError(SandpitError):
    """The server or the network did not answer in time."""


class InvalidRequestError(SandpitError):
    """The request was refused as invalid (400, 409, 422): validation, path not allowed."""


class SandpitConnectionError(SandpitError):
    """The server could not be reached."""


_BY_CODE: dict[str, type[SandpitError]] = {
    "not_authenticated": AuthError,
    "authentication_failed": AuthError,
    "forbidden": AuthError,
    "scope_missing": AuthError,
    "token_not_allowed": AuthError,
    "role_required": AuthError,
    "rate_limited": RateLimitError,
    "throttled": RateLimitError,
    "quota_exceeded": LimitError,
    "sandbox_limit_reached": LimitError,
    "terminal_limit_reached": LimitError,
    "watcher_limit_reached": LimitError,
    "run_limit_reached": LimitError,
    "file_too_large": LimitError,
    "payload_too_large": LimitError,
    "resource_exhausted": LimitError,
    "sandbox_not_running": SandboxError,
    "sandbox_gone": NotFoundError,
    "not_supported": SandboxError,
    "path_not_allowed": InvalidRequestError,
}

_BY_STATUS: dict[int, type[SandpitError]] = {
    400: InvalidRequestError,
    401: AuthError,
    402: PaymentRequiredError,
    403: AuthError,
    404: NotFoundError,
    409: InvalidRequestError,
    410: NotFoundError,
    413: LimitError,
    422: InvalidRequestError,
    429: LimitError,
    504: RequestTimeoutError,
    507: LimitError,
}


def error_from(
    code: str, message: str, status: int | None, *, retry_after_s: float | None = None
) -> SandpitError:
    """The exception for a server error: by code first, then by status family."""
    cls = _BY_CODE.get(code)
    if cls is None and status is not None:
        cls = _BY_STATUS.get(status) or (SandboxError if status >= 500 else InvalidRequestError)
    cls = cls or SandpitError
    if cls is RateLimitError:
        return RateLimitError(message, code=code, status=status, retry_after_s=retry_after_s)
    return cls(message, code=code, status=status)


def error_from_body(status: int, body: Any, *, retry_after_s: float | None = None) -> SandpitError:
    """From an HTTP error response's parsed JSON (anything else gets a generic message)."""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        code = str(error.get("code") or "error")
        message = str(error.get("message") or f"HTTP {status}")
    else:
        code, message = "error", f"The server answered HTTP {status}."
    return error_from(code, message, status, retry_after_s=retry_after_s)
