"""One error shape for the whole API: {"error": {"code": "...", "message": "..."}}."""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpResponse, JsonResponse
from django.urls import Resolver404, resolve
from django.views.decorators.csrf import csrf_exempt
from django.views.defaults import page_not_found, server_error

from . import database_errors
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


def is_api(request: Any) -> bool:
    return request.path.startswith("/api/")


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

    def process_exception(self, request: Any, exception: Exception) -> HttpResponse | None:
        """A view outside DRF (pages, the admin) that met a database that could not serve:
        503 with Retry-After, not a 500 (DRF's views answer through their handler)."""
        if not database_errors.database_unavailable(exception):
            return None
        logger.warning("Database unavailable (answered 503): %s: %s", request.path, exception)
        if is_api(request):
            response: HttpResponse = json_error_response(
                database_errors.CODE, database_errors.MESSAGE, 503
            )
        else:
            response = HttpResponse(database_errors.MESSAGE, status=503, content_type="text/plain")
        response["Retry-After"] = str(database_errors.RETRY_AFTER_S)
        return response


def _refused(request: Any) -> JsonResponse | None:
    if is_api(request) and (
        "\x00" in request.path or "%00" in request.META.get("QUERY_STRING", "")
    ):
        return json_error_response("malformed_request", "URLs must not contain NUL bytes.", 400)
    return None


def _in_shape(request: Any, response: Any) -> Any:
    if response.status_code < 400 or not is_api(request):
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
    if is_api(request):
        return json_error_response("not_found", "No such endpoint or object.", 404)
    return page_not_found(request, exception)


def handler500(request: Any) -> Any:
    if is_api(request):
        return json_error_response("internal_error", "Something went wrong on our side.", 500)
    return server_error(request)
