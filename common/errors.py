"""One error shape for the whole API: {"error": {"code": "...", "message": "..."}}."""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404, JsonResponse
from django.urls import Resolver404, resolve
from django.views.decorators.csrf import csrf_exempt

from .coded import CodedError

logger = logging.getLogger("django.request")


class ApplicationError(CodedError):
    """A business rule said no. Services raise these; the handler renders them."""

    def __init__(self, message: str, *, code: str | None = None, status_code: int | None = None):
        super().__init__(message)
        if code:
            self.code = code
        if status_code:
            self.status_code = status_code


class NotFound(ApplicationError):
    code = "not_found"
    status_code = 404


class Conflict(ApplicationError):
    code = "conflict"
    status_code = 409


class Forbidden(ApplicationError):
    code = "forbidden"
    status_code = 403


class QuotaExceeded(ApplicationError):
    code = "quota_exceeded"
    status_code = 429


class PaymentRequired(ApplicationError):
    code = "payment_required"
    status_code = 402


class PayloadTooLarge(ApplicationError):
    code = "payload_too_large"
    status_code = 413


def error_body(code: str, message: str, details: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "message": message}
    if details is not None:
        body["details"] = details
    return {"error": body}


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
    # Imported here: DRF's settings import our authentication, which imports this module.
    from rest_framework import exceptions
    from rest_framework.response import Response
    from rest_framework.views import exception_handler as drf_exception_handler

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
    if request is not None and _is_api(request):
        if code == "unsupported_media_type" and _takes_json(request):
            message = f"{message} Send Content-Type: application/json with a JSON body."
        elif code == "not_authenticated":
            message = _authorization_hint(request.META.get("HTTP_AUTHORIZATION", "")) or message
    response.data = error_body(code or "error", message)
    if response.status_code == 403 and code == "not_authenticated":
        response.status_code = 401
    return response


def _is_api(request: Any) -> bool:
    return request.path.startswith("/api/")


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


def json_error_response(code: str, message: str, status_code: int) -> JsonResponse:
    return JsonResponse(error_body(code, message), status=status_code)


@csrf_exempt
def api_not_found(request: Any, *args: Any, **kwargs: Any) -> JsonResponse:
    """Every /api/ path no route matched, any method: the JSON 404. A URL pattern rather
    than handler404 alone, because under DEBUG Django answers a miss with its HTML page
    listing every URL pattern and never calls handler404."""
    path = request.path
    if path.endswith("/") and _routed(path.rstrip("/")):
        return json_error_response(
            "not_found",
            f"No endpoint at {path}: API paths have no trailing slash; use {path.rstrip('/')}",
            404,
        )
    return json_error_response("not_found", "No such endpoint or object.", 404)


def _routed(path: str) -> bool:
    """Whether a view other than the /api/ catch-all serves `path`."""
    try:
        match = resolve(path)
    except Resolver404:
        return False
    return match.func is not api_not_found


_STATUS_CODES = {
    400: "malformed_request",
    401: "not_authenticated",
    403: "permission_denied",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "rate_limited",
    500: "internal_error",
}


class ApiErrorShapeMiddleware:
    """Outermost: every /api/ answer of 400 or more leaves in the one shape.

    Django refuses some requests before any view runs (an unknown Host header, a failed
    CSRF check, a body too large outside DRF) and, under DEBUG, renders those refusals as
    its technical pages with settings and tracebacks (text/html or text/plain); here they
    become the JSON error of the same status. A NUL byte in an /api/ URL is refused first, as PostgreSQL cannot
    compare strings holding one (every id lookup would fail with a 500).
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request: Any) -> Any:
        if iscoroutinefunction(self):
            return self.__acall__(request)
        return _refused(request) or _in_shape(request, self.get_response(request))

    async def __acall__(self, request: Any) -> Any:
        return _refused(request) or _in_shape(request, await self.get_response(request))


def _refused(request: Any) -> JsonResponse | None:
    if _is_api(request) and (
        "\x00" in request.path or "%00" in request.META.get("QUERY_STRING", "")
    ):
        return json_error_response("malformed_request", "URLs must not contain NUL bytes.", 400)
    return None


def _in_shape(request: Any, response: Any) -> Any:
    if response.status_code < 400 or not _is_api(request):
        return response
    if not response.get("Content-Type", "").startswith("text/"):
        # JSON already, or a DRF error rendered for another format (the YAML schema).
        return response
    status = response.status_code
    data = getattr(response, "data", None)
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        # A DRF view rendered our error as HTML (the API docs page): keep its code.
        shaped = JsonResponse(data, status=status)
    else:
        try:
            message = HTTPStatus(status).phrase + "."
        except ValueError:
            message = "The request failed."
        shaped = json_error_response(_STATUS_CODES.get(status, "error"), message, status)
    for header, value in response.items():
        if header.lower() not in ("content-type", "content-length"):
            shaped[header] = value
    return shaped


def handler404(request: Any, exception: Exception | None = None) -> Any:
    if _is_api(request):
        return json_error_response("not_found", "No such endpoint or object.", 404)
    from django.views.defaults import page_not_found

    return page_not_found(request, exception)


def handler500(request: Any) -> Any:
    if _is_api(request):
        return json_error_response("internal_error", "Something went wrong on our side.", 500)
    from django.views.defaults import server_error

    return server_error(request)
