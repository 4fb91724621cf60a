"""Many rows in one statement, for metering's hot paths (a tick writes a row per running
job): on PostgreSQL `UPDATE ... FROM unnest` and `INSERT ... SELECT FROM unnest`, one
array per column cast to the column's own type; elsewhere (the embedded SQLite) one
prepared statement run for every row (`executemany`), its values prepared by each column's
own field as Django's bulk methods prepare them. Django's own bulk methods cost about ten
times as much per row on PostgreSQL (values prepared one by one, an UPDATE of CASE WHENs),
which was most of a tick and of metering an event batch; on SQLite bulk_update's CASE
WHENs, each value a resolved expression, were a fifth of the event task's CPU under
bench/e2e.py."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections, models
from django.db.backends.base.base import BaseDatabaseWrapper


def _field(model: type[models.Model], name: str) -> models.Field[Any, Any]:
    field = model._meta.get_field(name)
    assert isinstance(field, models.Field), f"{model.__name__}.{name} is no column"
    return field


def _casts(fields: Sequence[models.Field[Any, Any]]) -> str:
    """unnest's arguments: an array per column, of the column's type."""
    return ", ".join(f"%s::{field.db_type(connection)}[]" for field in fields)


def _names(fields: Sequence[models.Field[Any, Any]]) -> list[str]:
    columns = [field.column for field in fields]
    assert None not in columns, "a field with no column"
    return [connection.ops.quote_name(str(column)) for column in columns]


def _table(model: type[models.Model]) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def _connection() -> BaseDatabaseWrapper:
    """This thread's connection itself, for the values' preparation: each field reads the
    connection's operations and features, and through the `connection` proxy each read
    is a lookup of the thread's connections (asgiref's Local), once a value: about half
    of what preparing a submission's job record cost."""
    return connections[DEFAULT_DB_ALIAS]


def _prepared(
    fields: Sequence[models.Field[Any, Any]], rows: Iterable[Sequence[Any]]
) -> list[list[Any]]:
    """Each row's values as its columns store them (what a query's parameters hold)."""
    db = _connection()
    return [
        [
            field.get_db_prep_save(value, connection=db)
            for field, value in zip(fields, row, strict=True)
        ]
        for row in rows
    ]


def update_fields(
    model: type[models.Model], objects: Sequence[models.Model], fields: Sequence[str]
) -> None:
    """Writes `fields` of each of `objects` (rows of `model`) back, by primary key."""
    if not objects:
        return
    if connection.vendor == "postgresql":
        _update_from_arrays(model, objects, fields)
    else:
        _update_each(model, objects, fields)


def _keyed_rows(
    model: type[models.Model], objects: Sequence[models.Model], fields: Sequence[str]
) -> tuple[list[models.Field[Any, Any]], list[list[Any]]]:
    """The key's field and `fields`' (in that order), and each object's values of them."""
    pk = model._meta.pk
    assert pk is not None
    columns = [pk, *(_field(model, name) for name in fields)]
    return columns, [[getattr(o, c.attname) for c in columns] for o in objects]


def _update_from_arrays(
    model: type[models.Model], objects: Sequence[models.Model], fields: Sequence[str]
) -> None:
    """`UPDATE ... FROM unnest`: one statement, one array per column (PostgreSQL)."""
    columns, rows = _keyed_rows(model, objects, fields)
    key, *names = _names(columns)
    sets = ", ".join(f"{name} = v.{name}" for name in names)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {_table(model)} AS t SET {sets} "  # noqa: S608 - the model's names
            f"FROM unnest({_casts(columns)}) AS v({', '.join([key, *names])}) "
            f"WHERE t.{key} = v.{key}",
            [list(column) for column in zip(*rows, strict=True)],
        )


def _update_each(
    model: type[models.Model], objects: Sequence[models.Model], fields: Sequence[str]
) -> None:
    """One UPDATE by key, run for every row: SQLite prepares it once."""
    columns, rows = _keyed_rows(model, objects, fields)
    key, *names = _names(columns)
    sets = ", ".join(f"{name} = %s" for name in names)
    with connection.cursor() as cursor:
        cursor.executemany(
            f"UPDATE {_table(model)} SET {sets} WHERE {key} = %s",  # noqa: S608 - the model's names
            [[*values, pk] for pk, *values in _prepared(columns, rows)],
        )


def insert_columns(model: type[models.Model], columns: Mapping[str, Sequence[Any]]) -> None:
    """Inserts rows of `model` given a list of values per column (a relation by its id:
    `run_id`), the lists of one length."""
    values = list(columns.values())
    if not values or not values[0]:
        return
    if connection.vendor == "postgresql":
        _insert_from_arrays(model, columns)
    else:
        _insert_each(model, columns)


def _insert_from_arrays(model: type[models.Model], columns: Mapping[str, Sequence[Any]]) -> None:
    """`INSERT ... SELECT FROM unnest`: one statement, one array per column (PostgreSQL)."""
    fields = [_field(model, name) for name in columns]
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {_table(model)} ({', '.join(_names(fields))}) "  # noqa: S608 - the model's names
            f"SELECT * FROM unnest({_casts(fields)})",
            [list(v) for v in columns.values()],
        )


def _insert_each(model: type[models.Model], columns: Mapping[str, Sequence[Any]]) -> None:
    """One INSERT of a row, run for every row: SQLite prepares it once."""
    fields = [_field(model, name) for name in columns]
    marks = ", ".join(["%s"] * len(fields))
    with connection.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO {_table(model)} ({', '.join(_names(fields))}) VALUES ({marks})",  # noqa: S608 - the model's names
            _prepared(fields, zip(*columns.values(), strict=True)),
        )


def insert_objects(
    model: type[models.Model],
    objects: Sequence[models.Model],
    *,
    unique: Sequence[str] = (),
    update: Sequence[str] = (),
) -> None:
    """Inserts `objects` (new instances of `model`, their primary key the database's) in
    one `INSERT ... VALUES` statement, each value prepared by its field as Django's
    `bulk_create` prepares it (defaults, `auto_now`). With `unique` and `update`, a row
    whose `unique` columns are taken already gets `update` from the new one instead
    (`ON CONFLICT ... DO UPDATE`, PostgreSQL's and SQLite's), as `bulk_create(...,
    update_conflicts=True)` does: without Django's query compiler, which was a fifth of
    the web's CPU a submission. The objects' primary keys are not read back."""
    if not objects:
        return
    db = _connection()
    head, row, tail, fields = _insert_parts(model, tuple(unique), tuple(update))
    rows = [
        [f.get_db_prep_save(f.pre_save(obj, True), connection=db) for f in fields]
        for obj in objects
    ]
    with db.cursor() as cursor:
        cursor.execute(
            head + ", ".join([row] * len(rows)) + tail,
            [value for values in rows for value in values],
        )


_INSERTS: dict[tuple[Any, ...], tuple[str, str, str, list[models.Field[Any, Any]]]] = {}


def _insert_parts(
    model: type[models.Model], unique: tuple[str, ...], update: tuple[str, ...]
) -> tuple[str, str, str, list[models.Field[Any, Any]]]:
    """`insert_objects`' statement, its rows left out (`INSERT INTO t (columns) VALUES`,
    one row's placeholders, and its `ON CONFLICT` clause), and the fields of its columns
    in order: made once for each model (per database vendor: quoting differs). A
    submission inserts a record and an audit event each time, and quoting their columns
    anew was a sixth of what writing them cost the web."""
    key = (connection.vendor, model, unique, update)
    found = _INSERTS.get(key)
    if found is None:
        fields = [f for f in model._meta.concrete_fields if not f.primary_key]
        head = f"INSERT INTO {_table(model)} ({', '.join(_names(fields))}) VALUES "
        row = "(" + ", ".join(["%s"] * len(fields)) + ")"
        tail = ""
        if unique:
            keys = _names([_field(model, name) for name in unique])
            sets = ", ".join(
                f"{name} = EXCLUDED.{name}"
                for name in _names([_field(model, name) for name in update])
            )
            tail = f" ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {sets}"
        found = _INSERTS[key] = (head, row, tail, fields)
    return found
