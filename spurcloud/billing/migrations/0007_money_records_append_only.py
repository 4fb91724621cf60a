"""Records of money refuse UPDATE and DELETE in the database itself (PostgreSQL), not
only in the admin and the models: ledger entries, invoices, their lines and credit
notes always; a price once it is in effect (a future one may still be corrected or
withdrawn, but not moved into the past).

Two ways through, both deliberate: Django's ON DELETE SET NULL of the user who made a
row (an UPDATE that changes nothing but clears `created_by_id`), and a repair by hand in
its own transaction after `SET LOCAL spur.allow_money_edit = 'on'`. TRUNCATE (the test
suite's flush) fires no row trigger. The embedded SQLite has the models' refusals only.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

APPEND_ONLY = ("billing_ledgerentry", "billing_invoice", "billing_invoiceline", "billing_creditnote")

FUNCTIONS = """
CREATE OR REPLACE FUNCTION spur_refuse_money_edit() RETURNS trigger AS $$
BEGIN
    IF current_setting('spur.allow_money_edit', true) = 'on' THEN
        RETURN COALESCE(NEW, OLD);
    END IF;
    IF TG_OP = 'UPDATE' AND (to_jsonb(NEW) ->> 'created_by_id') IS NULL
       AND (to_jsonb(NEW) - 'created_by_id') = (to_jsonb(OLD) - 'created_by_id') THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION '% rows are append-only: % refused (correct with a new record)',
        TG_TABLE_NAME, TG_OP;
END
$$ LANGUAGE plpgsql;

-- The wall clock, not the transaction's start (now()): as the model reads timezone.now().
CREATE OR REPLACE FUNCTION spur_refuse_price_edit() RETURNS trigger AS $$
BEGIN
    IF current_setting('spur.allow_money_edit', true) = 'on' THEN
        RETURN COALESCE(NEW, OLD);
    END IF;
    IF OLD.effective_from <= clock_timestamp() THEN
        RAISE EXCEPTION 'a price in effect is never edited or deleted: % refused (add a new entry)',
            TG_OP;
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.effective_from <= clock_timestamp() THEN
        RAISE EXCEPTION 'a price edited before it takes effect stays in the future';
    END IF;
    RETURN COALESCE(NEW, OLD);
END
$$ LANGUAGE plpgsql;
"""


def _triggers(schema_editor: Any, *, create: bool) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    tables = [(t, "spur_refuse_money_edit") for t in APPEND_ONLY]
    tables.append(("billing_priceentry", "spur_refuse_price_edit"))
    if create:
        schema_editor.execute(FUNCTIONS, params=None)  # its % are plpgsql's, not ours
    for table, function in tables:
        name = f"{table}_no_edit"
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {name} ON {table}")
        if create:
            schema_editor.execute(
                f"CREATE TRIGGER {name} BEFORE UPDATE OR DELETE ON {table} "
                f"FOR EACH ROW EXECUTE FUNCTION {function}()"
            )
    if not create:
        schema_editor.execute("DROP FUNCTION IF EXISTS spur_refuse_money_edit()")
        schema_editor.execute("DROP FUNCTION IF EXISTS spur_refuse_price_edit()")


def create_triggers(apps: Any, schema_editor: Any) -> None:
    _triggers(schema_editor, create=True)


def drop_triggers(apps: Any, schema_editor: Any) -> None:
    _triggers(schema_editor, create=False)


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0006_topup_expired"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="priceentry",
            options={
                "ordering": ["gpu_model", "qos_class", "effective_from"],
                "verbose_name": "price",
            },
        ),
        migrations.RunPython(create_triggers, drop_triggers),
    ]
