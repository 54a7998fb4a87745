"""The base of every API input serializer: a field it does not declare is a 400 naming it.

DRF drops undeclared keys silently, so `{"templat": "python"}` created a default sandbox and
a top-level `memory_mb` never reached `resources`: the caller learned nothing. Here an
unknown key is refused with what was probably meant: the nested object a misplaced field
belongs in, the level above for a field nested too deep, or the closest declared name.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from rest_framework import serializers


def _nested(field: serializers.Field) -> serializers.Serializer | None:
    """The serializer of an object-valued field (`resources`), or of a list of objects."""
    inner = field.child if isinstance(field, serializers.ListSerializer) else field
    return inner if isinstance(inner, serializers.Serializer) else None


def _is_subsequence(short: str, long: str) -> bool:
    letters = iter(long)
    return all(letter in letters for letter in short)


def _closest(key: str, names: list[str]) -> str | None:
    """The declared name `key` most likely meant: one it abbreviates or misses letters of
    (cmd -> command, templat -> template, cap -> cap_cents), else the most similar."""
    lowered = key.lower()
    shortened = [
        name for name in names if _is_subsequence(lowered, name) and lowered[:1] == name[:1]
    ]
    if shortened:
        return min(shortened, key=len)
    close = difflib.get_close_matches(lowered, names, n=1, cutoff=0.6)
    return close[0] if close else None


class InputSerializer(serializers.Serializer):
    """Validates like DRF's Serializer and also refuses keys that are not declared fields,
    each named in the error's details with a hint (see the module docstring)."""

    def to_internal_value(self, data: Any) -> Any:
        unknown = (
            {
                str(key): [self.unknown_field_message(str(key))]
                for key in data
                if key not in self.fields
            }
            if isinstance(data, Mapping)
            else {}
        )
        try:
            value = super().to_internal_value(data)
        except serializers.ValidationError as exc:
            if unknown and isinstance(exc.detail, dict):
                raise serializers.ValidationError({**unknown, **exc.detail}) from None
            raise
        if unknown:
            raise serializers.ValidationError(unknown)
        return value

    def unknown_field_message(self, key: str) -> str:
        for name, field in self.fields.items():
            nested = _nested(field)
            if nested is not None and key in nested.fields:
                return f'unknown field here; it belongs in {name}: {{"{name}": {{"{key}": …}}}}.'
        parent = self.parent
        if isinstance(parent, serializers.ListSerializer):
            parent = parent.parent
        if isinstance(parent, serializers.Serializer) and key in parent.fields:
            where = "the top level" if parent.parent is None else f"{parent.field_name}"
            return f"unknown field in {self.field_name}; it belongs at {where}, beside it."
        meant = _closest(key, list(self.fields))
        if meant:
            return f"unknown field; did you mean {meant}?"
        known = ", ".join(self.fields) or "none"
        return f"unknown field; the fields here are: {known}."
