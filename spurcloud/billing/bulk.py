"""Many rows in one statement, for metering's hot paths (a tick writes a row per running
job): on PostgreSQL `UPDATE ... FROM unnest` and `INSERT ... SELECT FROM unnest`, one
array per column cast to the column's own type; elsewhere (the embedded SQLite) Django's
bulk_update and bulk_create. Django's own bulk methods cost about ten times as much per
row on PostgreSQL (values prepared one by one, an UPDATE of CASE WHENs), which was most
of a tick and of metering an event batch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.db import connection, models


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


def update_fields(
    model: type[models.Model], objects: Sequence[models.Model], fields: Sequence[str]
) -> None:
    """Writes `fields` of each of `objects` (rows of `model`) back, by primary key."""
    if not objects:
        return
    if connection.vendor != "postgresql":
        model._default_manager.bulk_update(objects, list(fields), batch_size=500)
        return
    pk = model._meta.pk
    assert pk is not None
    columns = [pk, *(_field(model, name) for name in fields)]
    key, *names = _names(columns)
    sets = ", ".join(f"{name} = v.{name}" for name in names)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {_table(model)} AS t SET {sets} "  # noqa: S608 - the model's names
            f"FROM unnest({_casts(columns)}) AS v({', '.join([key, *names])}) "
            f"WHERE t.{key} = v.{key}",
            [[getattr(o, c.attname) for o in objects] for c in columns],
        )


def insert_columns(model: type[models.Model], columns: Mapping[str, Sequence[Any]]) -> None:
    """Inserts rows of `model` given a list of values per column (a relation by its id:
    `run_id`), the lists of one length."""
    fields = [_field(model, name) for name in columns]
    values = list(columns.values())
    if not values or not values[0]:
        return
    if connection.vendor != "postgresql":
        attnames = [f.attname for f in fields]
        model._default_manager.bulk_create(
            [model(**dict(zip(attnames, row, strict=True))) for row in zip(*values, strict=True)],
            batch_size=5000,
        )
        return
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {_table(model)} ({', '.join(_names(fields))}) "  # noqa: S608 - the model's names
            f"SELECT * FROM unnest({_casts(fields)})",
            [list(v) for v in values],
        )
