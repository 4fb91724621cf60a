"""The history version (`HistoryVersion`), kept by triggers on jobs_jobrecord.

PostgreSQL bumps it once per statement and organisation (transition tables); SQLite,
which has row triggers only, once per row. Either way in the writer's transaction: a
reader that sees the new version sees the rows that made it."""

from typing import Any

from django.db import migrations, models

_SQLITE = [
    """CREATE TRIGGER jobrecord_history_insert AFTER INSERT ON jobs_jobrecord BEGIN
        INSERT INTO jobs_historyversion (organization_id, version)
        VALUES (NEW.organization_id, abs(random() % 1000000000000))
        ON CONFLICT (organization_id) DO UPDATE SET version = version + 1;
    END""",
    """CREATE TRIGGER jobrecord_history_update AFTER UPDATE ON jobs_jobrecord BEGIN
        INSERT INTO jobs_historyversion (organization_id, version)
        VALUES (NEW.organization_id, abs(random() % 1000000000000))
        ON CONFLICT (organization_id) DO UPDATE SET version = version + 1;
        UPDATE jobs_historyversion SET version = version + 1
        WHERE organization_id = OLD.organization_id
          AND OLD.organization_id <> NEW.organization_id;
    END""",
    """CREATE TRIGGER jobrecord_history_delete AFTER DELETE ON jobs_jobrecord BEGIN
        UPDATE jobs_historyversion SET version = version + 1
        WHERE organization_id = OLD.organization_id;
    END""",
]
_SQLITE_DROP = [
    f"DROP TRIGGER IF EXISTS jobrecord_history_{op}" for op in ("insert", "update", "delete")
]

_POSTGRESQL_BUMP = """
CREATE FUNCTION jobrecord_history_bump() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Each statement names only the transition tables its trigger has.
    IF TG_OP = 'INSERT' THEN
        INSERT INTO jobs_historyversion (organization_id, version)
        SELECT organization_id, floor(random() * 1e12)::bigint
        FROM (SELECT DISTINCT organization_id FROM new_rows) AS changed
        ON CONFLICT (organization_id)
        DO UPDATE SET version = jobs_historyversion.version + 1;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO jobs_historyversion (organization_id, version)
        SELECT organization_id, floor(random() * 1e12)::bigint
        FROM (SELECT organization_id FROM new_rows UNION SELECT organization_id FROM old_rows) AS changed
        ON CONFLICT (organization_id)
        DO UPDATE SET version = jobs_historyversion.version + 1;
    ELSE
        UPDATE jobs_historyversion SET version = version + 1
        WHERE organization_id IN (SELECT organization_id FROM old_rows);
    END IF;
    RETURN NULL;
END $$"""
_POSTGRESQL = [
    _POSTGRESQL_BUMP,
    """CREATE TRIGGER jobrecord_history_insert AFTER INSERT ON jobs_jobrecord
       REFERENCING NEW TABLE AS new_rows
       FOR EACH STATEMENT EXECUTE FUNCTION jobrecord_history_bump()""",
    """CREATE TRIGGER jobrecord_history_update AFTER UPDATE ON jobs_jobrecord
       REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
       FOR EACH STATEMENT EXECUTE FUNCTION jobrecord_history_bump()""",
    """CREATE TRIGGER jobrecord_history_delete AFTER DELETE ON jobs_jobrecord
       REFERENCING OLD TABLE AS old_rows
       FOR EACH STATEMENT EXECUTE FUNCTION jobrecord_history_bump()""",
]
_POSTGRESQL_DROP = [
    *(f"DROP TRIGGER IF EXISTS jobrecord_history_{op} ON jobs_jobrecord"
      for op in ("insert", "update", "delete")),  # fmt: skip
    "DROP FUNCTION IF EXISTS jobrecord_history_bump()",
]


def _run(statements: dict[str, list[str]]) -> Any:
    def run(apps: Any, schema_editor: Any) -> None:
        vendor = schema_editor.connection.vendor
        if vendor not in statements:
            raise RuntimeError(f"no history version triggers for {vendor}")
        for statement in statements[vendor]:
            schema_editor.execute(statement)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0007_jobrecord_array_tasks"),
    ]

    operations = [
        migrations.CreateModel(
            name="HistoryVersion",
            fields=[
                ("organization_id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("version", models.BigIntegerField()),
            ],
        ),
        migrations.RunPython(
            _run({"sqlite": _SQLITE, "postgresql": _POSTGRESQL}),
            _run({"sqlite": _SQLITE_DROP, "postgresql": _POSTGRESQL_DROP}),
        ),
    ]
