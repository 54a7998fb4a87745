"""One model row by a fixed condition, or one new row: the statement, its converters and
the model's attribute order worked out once, the row read or written with a plain cursor.

For a lookup made on every request (the caller's organization, the sandbox an operation
names) the ORM compiled the query each time, and a raw queryset still re-derived the
columns from the cursor's description, their converters and the model's init order on
every call: 0.35 ms of CPU for an organization and 0.6 ms for a sandbox here, against 0.15
and 0.2 ms for the statement alone. The instance is built as the ORM builds it
(the compiler's converters, then ``Model.from_db``), so nothing tells the two apart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field, ForeignKey, Model
from django.db.models.signals import post_save, pre_save

M = TypeVar("M", bound=Model)

Converter = Callable[[Any, Any, BaseDatabaseWrapper], Any]


@dataclass(frozen=True)
class _Columns:
    """One model's columns in a statement's result: where they start, and how each becomes
    the attribute the ORM would give it."""

    model: type[Model]
    start: int
    attnames: tuple[str, ...]
    converters: tuple[tuple[int, tuple[Converter, ...], Any], ...]
    """(column index within the model's part, the converters the compiler applies to it,
    its expression)."""

    def instance(self, row: tuple[Any, ...], connection: BaseDatabaseWrapper, using: str) -> Any:
        values = list(row[self.start : self.start + len(self.attnames)])
        for index, converters, expression in self.converters:
            value = values[index]
            for convert in converters:
                value = convert(value, expression, connection)
            values[index] = value
        return self.model.from_db(using, self.attnames, values)


@dataclass(frozen=True)
class _Plan:
    sql: str
    columns: _Columns
    joined: _Columns | None
    selected: str
    """The statement's columns, as its SELECT lists them."""
    joined_table: str
    """The joined model's table (quoted), "" without a join."""
    join_condition: str
    """What joins it to the model's row, "" without a join."""


class RowLookup(Generic[M]):
    """`model`'s row whose `fields` (names, "pk" allowed) equal the parameters given to
    `get`, as ``model.objects.get(...)`` would return it, or None.

    `join` (a non-null foreign key of `model`) reads the row it points to in the same
    statement, as ``select_related(join)`` does: the instance comes back with it loaded.

    `first_by`: where several rows match, the first in this order, as
    ``order_by(*first_by).first()`` (names of `model`'s fields, or ``<join>__<field>`` of the
    joined model's, ascending); without it the fields must name one row at most."""

    def __init__(
        self,
        model: type[M],
        *fields: str,
        join: str | None = None,
        first_by: tuple[str, ...] = (),
    ) -> None:
        self.model = model
        self.fields = fields
        self.join = join
        self.first_by = first_by
        self._plans: dict[str, _Plan] = {}

    def sql(self, using: str = "default") -> str:
        return self._plan(using).sql

    def get(self, *params: str | int, using: str = "default") -> M | None:
        row = self.row(*params, using=using)
        return None if row is None else self.instance(row, using=using)

    def row(self, *params: str | int, using: str = "default") -> tuple[Any, ...] | None:
        """The statement's row as the database driver returned it (before any field's
        conversion: strings, numbers, datetimes, nothing mutable), or None."""
        with connections[using].cursor() as cursor:
            cursor.execute(self._plan(using).sql, params)
            row = cursor.fetchone()
        return None if row is None else tuple(row)

    def instance(self, row: tuple[Any, ...], using: str = "default") -> M:
        """A new instance from a row `row()` returned, as `get` builds it."""
        plan = self._plan(using)
        connection = connections[using]
        instance: M = plan.columns.instance(row, connection, using)
        if plan.joined is not None and self.join is not None:
            # The descriptor's own assignment: as select_related leaves it, cached.
            setattr(instance, self.join, plan.joined.instance(row, connection, using))
        return instance

    def _plan(self, using: str) -> _Plan:
        plan = self._plans.get(using)
        if plan is None:  # a race builds the same plan twice; either is kept
            plan = self._plans[using] = self._build(using)
        return plan

    def _build(self, using: str) -> _Plan:
        connection = connections[using]
        quote = connection.ops.quote_name
        meta = self.model._meta
        table = quote(meta.db_table)
        columns = _columns(self.model, using, 0)
        selected = [f"{table}.{quote(field.column)}" for field in meta.concrete_fields]
        source = table
        joined = None
        other = on = ""
        if self.join is not None:
            key = meta.get_field(self.join)
            related = getattr(key, "related_model", None)
            if not isinstance(key, ForeignKey) or key.null or related is None:
                raise ValueError(f"{self.model.__name__}.{self.join} is not a required foreign key")
            joined = _columns(related, using, len(selected))
            other = quote(related._meta.db_table)
            selected += [
                f"{other}.{quote(field.column)}" for field in related._meta.concrete_fields
            ]
            target = quote(key.target_field.column)
            on = f"{other}.{target} = {table}.{quote(key.column)}"
            source += f" INNER JOIN {other} ON {on}"
        where = " AND ".join(f"{table}.{quote(self._column(name))} = %s" for name in self.fields)
        # Identifiers from the models, quoted; the values are parameters.
        sql = f"SELECT {', '.join(selected)} FROM {source} WHERE {where}"  # noqa: S608
        if self.first_by:
            order = ", ".join(self._ordered_column(name, quote, other) for name in self.first_by)
            sql += f" ORDER BY {order} LIMIT 1"
        return _Plan(sql, columns, joined, ", ".join(selected), other, on)

    def update_sql(self, assignments: str, condition: str, using: str = "default") -> str:
        """An UPDATE of the model's table (``SET assignments WHERE condition``: the columns
        it sets unqualified, those it tests qualified by the quoted table name) that returns
        the row this lookup would read right after it, joined row included, in the same
        order (PostgreSQL's ``RETURNING``): a write that hands back what `row()` would read."""
        plan = self._plan(using)
        table = connections[using].ops.quote_name(self.model._meta.db_table)
        if plan.joined_table:
            source = f" FROM {plan.joined_table}"
            condition = f"{plan.join_condition} AND ({condition})"
        else:
            source = ""
        # Identifiers from the models, quoted; the values are the caller's parameters.
        return (
            f"UPDATE {table} SET {assignments}{source} "  # noqa: S608
            f"WHERE {condition} RETURNING {plan.selected}"
        )

    def insert_sql(self, insert: str, using: str = "default") -> str:
        """`insert` (an INSERT of one row into the model's table, without RETURNING) that
        returns the row this lookup would read right after it, joined row included, in the
        same order (PostgreSQL): the insert is a WITH query named as the table, which the
        lookup's columns then read, and whose own INSERT still names the table itself."""
        plan = self._plan(using)
        table = connections[using].ops.quote_name(self.model._meta.db_table)
        source = table
        if plan.joined_table:
            source += f" INNER JOIN {plan.joined_table} ON {plan.join_condition}"
        # Identifiers from the models, quoted; the values are the caller's parameters.
        return f"WITH {table} AS ({insert} RETURNING *) SELECT {plan.selected} FROM {source}"  # noqa: S608

    def width(self, using: str = "default") -> int:
        """How many of the statement's columns are the model's own (the joined row's follow)."""
        return len(self._plan(using).columns.attnames)

    def _ordered_column(self, name: str, quote: Callable[[str], str], joined: str) -> str:
        """A `first_by` name as the statement's (quoted) column; `joined` is the joined
        model's quoted table."""
        if self.join and name.startswith(f"{self.join}__"):
            related = self.model._meta.get_field(self.join).related_model
            if not isinstance(related, type) or not issubclass(related, Model):
                raise ValueError(f"{self.model.__name__}.{self.join} is not a foreign key")
            return f"{joined}.{quote(_column(related, name[len(self.join) + 2 :]))}"
        return f"{quote(self.model._meta.db_table)}.{quote(self._column(name))}"

    def _column(self, name: str) -> str:
        return _column(self.model, name)


def _column(model: type[Model], name: str) -> str:
    """The column of `model`'s field `name` ("pk" allowed)."""
    meta = model._meta
    field = meta.pk if name == "pk" else meta.get_field(name)
    column = getattr(field, "column", None)
    if not isinstance(column, str):
        raise ValueError(f"{model.__name__}.{name} is not a column")
    return column


def _columns(model: type[Model], using: str, start: int) -> _Columns:
    """`model`'s concrete columns from `start` on, with the converters its compiler applies."""
    meta = model._meta
    fields = meta.concrete_fields
    compiler = model._default_manager.all().query.get_compiler(using)
    found = compiler.get_converters([field.get_col(meta.db_table) for field in fields])
    converters = tuple(
        (index, tuple(functions), expression)
        for index, (functions, expression) in sorted(found.items())
    )
    return _Columns(model, start, tuple(field.attname for field in fields), converters)


class RowInsert(Generic[M]):
    """`model`'s INSERT of every concrete column, written once; `insert(instance)` stores a
    new instance as ``instance.save(force_insert=True)`` stores it: each field's
    ``pre_save(add=True)`` (so ``auto_now_add`` and the like apply) and
    ``get_db_prep_save``, then the instance marked saved. The ORM compiled the statement and
    walked the fields' machinery for every create (0.57 ms of a sandbox create's CPU).

    Only for models whose primary key is set before the insert (a default, not a database
    sequence) and that return no column from it. While anything listens to the model's
    pre_save or post_save, it saves through the ORM, which sends them."""

    def __init__(self, model: type[M]) -> None:
        meta = model._meta
        fields: tuple[Field[Any, Any], ...] = tuple(meta.local_concrete_fields)
        if meta.auto_field is not None or meta.db_returning_fields:
            raise ValueError(f"{model.__name__} gets values back from its insert: use the ORM")
        # django-stubs 5.2 lacks Field.has_db_default (Django >= 5.0 has it).
        if meta.parents or any(field.generated or field.has_db_default() for field in fields):  # type: ignore[attr-defined]
            raise ValueError(f"{model.__name__}'s insert is not one plain statement: use the ORM")
        self.model = model
        self.fields = fields
        self._sql: dict[str, str] = {}

    def sql(self, using: str = "default") -> str:
        sql = self._sql.get(using)
        if sql is None:
            quote = connections[using].ops.quote_name
            columns = ", ".join(quote(field.column) for field in self.fields)
            marks = ", ".join(["%s"] * len(self.fields))
            table = quote(self.model._meta.db_table)
            # Identifiers from the model, quoted; the values are parameters.
            sql = self._sql[using] = f"INSERT INTO {table} ({columns}) VALUES ({marks})"  # noqa: S608
        return sql

    def insert(self, instance: M, using: str = "default") -> M:
        if self.saves_through_orm():
            instance.save(force_insert=True, using=using)
            return instance
        with connections[using].cursor() as cursor:
            cursor.execute(self.sql(using), self.values(instance, using))
        return self.saved(instance, using)

    def saves_through_orm(self) -> bool:
        """Whether something listens to the model's saves (then only the ORM may save it)."""
        return pre_save.has_listeners(self.model) or post_save.has_listeners(self.model)

    def values(self, instance: M, using: str = "default") -> list[Any]:
        """The instance's column values as its insert sends them, in the statement's order."""
        connection = connections[using]
        return [
            field.get_db_prep_save(field.pre_save(instance, True), connection)
            for field in self.fields
        ]

    def sql_where(self, condition: str, using: str = "default") -> str:
        """The insert of one row only while `condition` (SQL, its own parameters after the
        values') holds when the statement runs: ``INSERT ... SELECT <values> WHERE ...``.
        Each value is cast to its column's type, which a VALUES list would have implied."""
        written = self._sql.get(f"{using} WHERE {condition}")
        if written is None:
            connection = connections[using]
            quote = connection.ops.quote_name
            columns = ", ".join(quote(field.column) for field in self.fields)
            typed = ", ".join(f"%s::{field.db_type(connection)}" for field in self.fields)
            table = quote(self.model._meta.db_table)
            # Identifiers and types from the model; the values are parameters.
            written = f"INSERT INTO {table} ({columns}) SELECT {typed} WHERE {condition}"  # noqa: S608
            self._sql[f"{using} WHERE {condition}"] = written
        return written

    def saved(self, instance: M, using: str = "default") -> M:
        """Mark `instance` stored, as the ORM does after its insert."""
        instance._state.adding = False
        instance._state.db = using
        return instance
