"""common/negotiation.py: the `*/*` shortcut picks what DRF's negotiation picks, and every
other Accept header is still negotiated by DRF (406 included)."""

from __future__ import annotations

import pytest
from rest_framework.exceptions import NotAcceptable
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory

from billing.apis import CsvRenderer
from common.negotiation import AnyFirstNegotiation
from tests.conftest import assert_error

ACCEPTS = [
    None,
    "*/*",
    "application/json",
    "application/json; indent=4",
    "text/csv",
    "text/*",
    "text/csv;q=0.9, application/json;q=0.1",
    "*/*; q=0.5, text/csv",
    "text/html",
    "",
]


def _picked(negotiation: DefaultContentNegotiation, accept: str | None, path: str) -> object:
    headers = {} if accept is None else {"HTTP_ACCEPT": accept}
    request = Request(APIRequestFactory().get(path, **headers))
    renderers: list[BaseRenderer] = [JSONRenderer(), CsvRenderer()]
    try:
        renderer, media_type = negotiation.select_renderer(request, renderers)
    except NotAcceptable:
        return "406"
    return type(renderer), media_type


@pytest.mark.parametrize("path", ["/api/v1/usage", "/api/v1/usage?format=csv"])
@pytest.mark.parametrize("accept", ACCEPTS)
def test_the_same_renderer_as_drfs_negotiation(accept, path):
    assert _picked(AnyFirstNegotiation(), accept, path) == _picked(
        DefaultContentNegotiation(), accept, path
    )


def test_any_media_type_is_not_parsed(monkeypatch):
    parsed: list[str] = []
    original = DefaultContentNegotiation.select_renderer

    def counting(self, request, renderers, format_suffix=None):  # type: ignore[no-untyped-def]
        parsed.append(request.META.get("HTTP_ACCEPT", "-"))
        return original(self, request, renderers, format_suffix)

    monkeypatch.setattr(DefaultContentNegotiation, "select_renderer", counting)
    for accept in (None, "*/*"):
        assert _picked(AnyFirstNegotiation(), accept, "/api/v1/usage")[0] is JSONRenderer  # type: ignore[index]
    assert parsed == []
    _picked(AnyFirstNegotiation(), "*/*", "/api/v1/usage?format=csv")
    _picked(AnyFirstNegotiation(), "text/csv", "/api/v1/usage")
    assert parsed == ["*/*", "text/csv"]


def test_an_unacceptable_accept_header_is_a_406_in_the_one_shape(api_a):
    assert_error(api_a.get("/api/v1/sandboxes", HTTP_ACCEPT="text/html"), 406)
    assert api_a.get("/api/v1/sandboxes", HTTP_ACCEPT="*/*").status_code == 200
