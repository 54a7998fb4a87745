"""The API's URL list is flat (playground/urls.py): every pattern is reached by its own
paths, whatever its place in the list, so no earlier pattern shadows a later one."""

from __future__ import annotations

import re

from django.urls import URLPattern, resolve, reverse

from playground.urls import api_v1

SAMPLE_BY_CONVERTER = {"str": "sb_0123456789abcdef", "int": "7", "pid": "7", "slug": "a-slug"}


def _named(pattern: URLPattern) -> str:
    assert pattern.name, f"API pattern {pattern.pattern} has no name"
    return pattern.name


def test_every_api_path_resolves_to_its_own_pattern() -> None:
    assert all(isinstance(pattern, URLPattern) for pattern in api_v1)
    names = [_named(pattern) for pattern in api_v1]
    assert len(names) == len(set(names)), "two API patterns share a name"
    for pattern in api_v1:
        converters = dict(
            (name, converter or "str")
            for converter, name in re.findall(r"<(?:(\w+):)?(\w+)>", str(pattern.pattern))
        )
        kwargs = {name: SAMPLE_BY_CONVERTER[converter] for name, converter in converters.items()}
        path = reverse(pattern.name, kwargs=kwargs or None)
        match = resolve(path)
        assert match.url_name == pattern.name, (
            f"{path} reaches {match.url_name}, not {pattern.name}"
        )
        assert match.func is pattern.callback


def test_a_sandbox_path_that_is_no_endpoint_is_the_api_404() -> None:
    match = resolve("/api/v1/sandboxes/sb_1/nothing-here")
    assert match.url_name is None
    assert match.func.__name__ == "api_not_found"
