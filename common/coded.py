"""The base of every error that knows its API code and HTTP status. Services raise
ApplicationError (common/errors.py), providers raise ProviderError (sandboxes/providers/base.py);
both are CodedErrors, so the error handlers render either without importing an app, and
providers need nothing from Django."""

from __future__ import annotations


class CodedError(Exception):
    code = "error"
    status_code = 400

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message
