"""DRF's EXCEPTION_HANDLER: every error a DRF view raises leaves in the one shape.

Apart from common/errors.py because it imports DRF at its top: DRF's settings import the
authentication classes (accounts/authentication.py), which import common.errors, so that
module must not import DRF's views while DRF's settings load."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from . import database_errors
from .coded import CodedError
from .errors import error_body, is_api

logger = logging.getLogger("django.request")


def _first_message(detail: Any) -> str:
    if isinstance(detail, list) and detail:
        return _first_message(detail[0])
    if isinstance(detail, dict) and detail:
        field, value = next(iter(detail.items()))
        inner = _first_message(value)
        return inner if field == "non_field_errors" else f"{field}: {inner}"
    return str(detail)


_DRF_CODES = {
    "NotAuthenticated": "not_authenticated",
    "AuthenticationFailed": "authentication_failed",
    "PermissionDenied": "permission_denied",
    "NotFound": "not_found",
    "MethodNotAllowed": "method_not_allowed",
    "NotAcceptable": "not_acceptable",
    "UnsupportedMediaType": "unsupported_media_type",
    "Throttled": "rate_limited",
    "ParseError": "malformed_request",
}


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Any:
    """DRF EXCEPTION_HANDLER: every error leaves in the one shape."""
    if isinstance(exc, CodedError):
        return Response(error_body(exc.code, exc.message), status=exc.status_code)
    if isinstance(exc, DjangoValidationError):
        return Response(error_body("validation_error", "; ".join(exc.messages)), status=400)
    if isinstance(exc, RequestDataTooBig):
        # Raised by request.body when a JSON body passes DATA_UPLOAD_MAX_MEMORY_SIZE.
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return Response(
            error_body("payload_too_large", f"JSON bodies are limited to {limit} bytes."),
            status=413,
        )
    if database_errors.database_unavailable(exc):
        return database_unavailable_response(context.get("request"), exc)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()

    response = drf_exception_handler(exc, context)
    request = context.get("request")
    if response is None:
        # Anything else is our bug. Logged with its traceback; the client gets the one
        # shape without it, even under DEBUG (a debug page would show settings and code).
        logger.error(
            "Internal Server Error: %s",
            getattr(request, "path", "?"),
            exc_info=(type(exc), exc, exc.__traceback__),
        )
        return Response(
            error_body("internal_error", "Something went wrong on our side."), status=500
        )
    if isinstance(exc, exceptions.ValidationError):
        response.data = error_body(
            "validation_error", _first_message(exc.detail), details=exc.detail
        )
        return response
    code = next(
        (_DRF_CODES[cls.__name__] for cls in type(exc).__mro__ if cls.__name__ in _DRF_CODES),
        None,
    )
    if code is None and isinstance(exc, exceptions.APIException):
        code = str(exc.default_code)
    detail = getattr(exc, "detail", str(exc))
    message = _first_message(detail)
    if request is not None and is_api(request):
        if code == "unsupported_media_type" and _takes_json(request):
            message = f"{message} Send Content-Type: application/json with a JSON body."
        elif code == "not_authenticated":
            message = _authorization_hint(request.META.get("HTTP_AUTHORIZATION", "")) or message
    response.data = error_body(code or "error", message)
    if response.status_code == 403 and code == "not_authenticated":
        response.status_code = 401
    return response


def database_unavailable_response(request: Any, exc: Exception) -> Response:
    """503 with Retry-After: the database could not serve (common/database_errors.py). Not
    our bug, so one warning line, no traceback."""
    logger.warning(
        "Database unavailable (answered 503): %s: %s", getattr(request, "path", "?"), exc
    )
    return Response(
        error_body(database_errors.CODE, database_errors.MESSAGE),
        status=503,
        headers={"Retry-After": str(database_errors.RETRY_AFTER_S)},
    )


def _takes_json(request: Any) -> bool:
    return any(parser.media_type == "application/json" for parser in request.parsers)


_BEARER_USE = "Use Authorization: Bearer sp_… (an API key) or Bearer <sandbox token>."


def _authorization_hint(header: str) -> str | None:
    """What was wrong with an Authorization header that no authentication class accepted,
    without echoing the credential; None when there was no header."""
    parts = header.split()
    if not parts:
        return None
    if len(parts) == 1:
        if parts[0].startswith("sp_"):
            return "Use Authorization: Bearer sp_… (the header lacks the Bearer scheme)."
        if parts[0].count(".") == 2:
            return "Use Authorization: Bearer <sandbox token> (the header lacks the Bearer scheme)."
        return f"{_BEARER_USE} The header lacks the Bearer scheme."
    scheme = parts[0]
    if scheme.lower() != "bearer":
        return f"The Authorization scheme {scheme[:20]!r} is not accepted. {_BEARER_USE}"
    if len(parts) > 2:
        return f"Bearer takes one value. {_BEARER_USE}"
    return "Bearer takes an API key (sp_…) or a sandbox token (a JWT), and this is neither."
