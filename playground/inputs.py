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
    if isinstance(field, serializers.ListSerializer):
        field = field.child
    return field if isinstance(field, serializers.Serializer) else None


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
        close = difflib.get_close_matches(key, list(self.fields), n=1, cutoff=0.6)
        if close:
            return f"unknown field; did you mean {close[0]}?"
        known = ", ".join(self.fields) or "none"
        return f"unknown field; the fields here are: {known}."
