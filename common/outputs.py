"""Output serializers for responses sent on every request.

DRF's `Serializer.to_representation` walks its fields generically for each object: a
generator over the bound fields, `get_attribute` with its source walk and exception
handling per field, and per datetime field a lookup of the current timezone (an
asgiref-local read under ASGI). For a sandbox (19 fields, 7 of them datetimes) that was
0.15-0.3 ms of a 2 ms API read's CPU. `DirectOutput` works out once per serializer
instance how each field is read, and reads it the same way: the result is what DRF's walk
returns, which tests/common/test_outputs.py checks field type by field type.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, tzinfo
from typing import Any

from django.conf import settings
from django.core.exceptions import FieldDoesNotExist
from django.utils import timezone
from rest_framework import ISO_8601, serializers
from rest_framework.relations import PKOnlyObject, PrimaryKeyRelatedField
from rest_framework.settings import api_settings

Reader = Callable[[Any, "tzinfo | None"], Any]


def _iso_datetime(field: serializers.DateTimeField) -> Reader:
    """A DateTimeField rendered as ISO 8601 in the current timezone (DRF's default):
    `Z` for UTC, as DRF writes it. Anything unusual (a naive value, a value that overflows
    on conversion) goes to the field itself, which renders or refuses it."""
    name = str(field.source)

    def read(instance: Any, zone: tzinfo | None) -> Any:
        value = getattr(instance, name)
        if value is None:
            return None
        if zone is None or not isinstance(value, datetime) or value.tzinfo is None:
            return field.to_representation(value)
        try:
            text = value.astimezone(zone).isoformat()
        except OverflowError:
            return field.to_representation(value)
        return text[:-6] + "Z" if text.endswith("+00:00") else text

    return read


def _primary_key(field: PrimaryKeyRelatedField, attname: str) -> Reader:
    """A related object's primary key, from the row's own column (as DRF's pk-only
    optimization does): no query."""

    def read(instance: Any, zone: tzinfo | None) -> Any:
        value = getattr(instance, attname)
        return None if value is None else field.to_representation(PKOnlyObject(pk=value))

    return read


def _attribute(field: serializers.Field, name: str) -> Reader:
    convert = field.to_representation

    def read(instance: Any, zone: tzinfo | None) -> Any:
        value = getattr(instance, name)
        return None if value is None else convert(value)

    return read


def _generic(field: serializers.Field) -> Reader:
    """DRF's own walk for one field (dotted or '*' sources, method fields, nested ones)."""

    def read(instance: Any, zone: tzinfo | None) -> Any:
        attribute = field.get_attribute(instance)
        check = attribute.pk if isinstance(attribute, PKOnlyObject) else attribute
        return None if check is None else field.to_representation(attribute)

    return read


def _reader(field: serializers.Field, model: Any) -> Reader:
    """How `field` is read: directly when its source is one of the model's own columns and
    the field reads attributes as DRF's base Field does, else by DRF's walk."""
    source = field.source
    column = None
    if model is not None and isinstance(source, str) and field.source_attrs == [source]:
        try:
            column = model._meta.get_field(source)
        except FieldDoesNotExist:
            column = None
    if column is None or not getattr(column, "concrete", False):
        return _generic(field)
    if column.is_relation:
        if (
            isinstance(field, PrimaryKeyRelatedField)
            and field.use_pk_only_optimization()
            and (column.many_to_one or column.one_to_one)
        ):
            return _primary_key(field, column.attname)
        return _generic(field)
    if type(field).get_attribute is not serializers.Field.get_attribute:
        return _generic(field)  # e.g. ModelField, which reads the whole object
    if (
        type(field) is serializers.DateTimeField
        and not hasattr(field, "timezone")
        and str(getattr(field, "format", api_settings.DATETIME_FORMAT)).lower() == ISO_8601
    ):
        return _iso_datetime(field)
    return _attribute(field, column.name)


class DirectOutput(serializers.Serializer):
    """Mix into a model's output serializer (before ModelSerializer) whose objects are
    rendered on hot paths. Only the model's own columns are read directly; every other
    field (methods, dotted sources, nested serializers) goes through DRF's walk."""

    _readers: list[tuple[str, Reader]] | None = None

    def to_representation(self, instance: Any) -> dict[str, Any]:
        if isinstance(instance, Mapping):  # DRF reads mappings by key
            return dict(super().to_representation(instance))
        readers = self._readers
        if readers is None:
            model = getattr(getattr(self, "Meta", None), "model", None)
            readers = self._readers = [
                (field.field_name, _reader(field, model))  # type: ignore[misc]
                for field in self._readable_fields
            ]
        zone = timezone.get_current_timezone() if settings.USE_TZ else None
        return {name: read(instance, zone) for name, read in readers}
