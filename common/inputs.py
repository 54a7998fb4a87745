"""The base of every API input serializer: a field it does not declare is a 400 naming it.

DRF drops undeclared keys silently, so `{"templat": "python"}` created a default sandbox and
a top-level `memory_mb` never reached `resources`: the caller learned nothing. Here an
unknown key is refused with what was probably meant: the nested object a misplaced field
belongs in, the level above for a field nested too deep, or the closest declared name.
"""

from __future__ import annotations

import difflib
import threading
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from django.utils.functional import cached_property
from rest_framework import serializers
from rest_framework.utils.serializer_helpers import BindingDict

_SHARED_FIELDS: dict[type[serializers.Serializer], BindingDict | None] = {}
"""A class's shared fields; None for a class with a mutable default, as DRF returns a
default itself, not a copy: a shared one would carry one request's changes into the next."""
_SHARED_FIELDS_LOCK = threading.RLock()  # a class's nested inputs build theirs inside


def _mutable_default(fields: Iterable[serializers.Field]) -> bool:
    for field in fields:
        if isinstance(getattr(field, "default", None), list | dict | set | bytearray):
            return True
        nested = _nested(field)
        inner = [*(nested.fields.values() if nested is not None else ())]
        child = getattr(field, "child", None)
        if isinstance(child, serializers.Field) and not isinstance(child, serializers.Serializer):
            inner.append(child)
        if inner and _mutable_default(inner):
            return True
    return False


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
    each named in the error's details with a hint (see the module docstring).

    Its fields are built once per class and shared by its instances (`fields`): DRF builds
    them per instance, re-running every declared field's constructor (validators, error
    messages merged along the class's MRO), 0.3 ms of a command request's 0.5 ms of
    validation here, on every POST. Validation keeps its state on the serializer instance,
    not on its fields; an instance with a context or `partial` (which fields read through
    their root) gets fields of its own, as does a class that sets `share_fields = False`
    (one that changes `self.fields` per instance must)."""

    share_fields: ClassVar[bool] = True

    @cached_property
    def fields(self) -> BindingDict:
        if not self.share_fields or getattr(self.root, "partial", False) or self.context:
            return self.bound_fields()
        cls = type(self)
        if cls not in _SHARED_FIELDS:
            with _SHARED_FIELDS_LOCK:
                if cls not in _SHARED_FIELDS:
                    # Bound to an instance holding no request's data, kept for the class.
                    built = cls().bound_fields()
                    _SHARED_FIELDS[cls] = None if _mutable_default(built.values()) else built
        shared = _SHARED_FIELDS[cls]
        return shared if shared is not None else self.bound_fields()

    def bound_fields(self) -> BindingDict:
        """This instance's own fields, as DRF builds them."""
        fields = BindingDict(self)
        for name, field in self.get_fields().items():
            fields[name] = field
        return fields

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
