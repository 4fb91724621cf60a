"""The history's version (`HistoryVersion`, kept by the database's triggers) and the
history list's answers kept for it (`spurcloud.jobs.kept`): a kept answer is never one
the database would no longer give, and never another organisation's."""

from __future__ import annotations

import importlib
import sqlite3
from typing import Any

import pytest
from rest_framework.test import APIClient

from spurcloud.jobs import kept, selectors
from spurcloud.jobs.models import JobRecord
from spurcloud.jobs.services import record_job_event
from tests.spurcloud.conftest import Tenant, event, job_dict

MIGRATION = importlib.import_module("spurcloud.jobs.migrations.0008_history_version")


@pytest.fixture(autouse=True)
def _fresh_answers() -> None:
    kept.HISTORY.clear()


def _record(job_id: int, tenant: str, **changes: Any) -> None:
    record_job_event(event=event(job_dict(job_id, tenant=tenant, user="max", **changes)))


def test_every_write_of_an_organisations_history_moves_its_version_alone(
    acme: Tenant, globex: Tenant
) -> None:
    assert selectors.history_version(acme.organization) == 0  # no history yet
    _record(1, "acme", state="RUNNING")
    _record(99, "globex", state="RUNNING")
    versions = [selectors.history_version(acme.organization)]
    others = selectors.history_version(globex.organization)
    assert versions[0] != 0

    def moved() -> bool:
        versions.append(selectors.history_version(acme.organization))
        return versions[-1] != versions[-2]

    _record(1, "acme", state="COMPLETED")  # the event mirror
    assert moved()
    JobRecord.objects.filter(job_id=1).update(name="renamed")  # a bulk update, no save()
    assert moved()
    record = JobRecord.objects.get(job_id=1)
    record.reason = "None"
    record.save()
    assert moved()
    JobRecord.objects.bulk_create(
        [
            JobRecord(cluster="spur", job_id=j, organization=acme.organization, user="max")
            for j in (5, 6, 7)
        ]  # fmt: skip
    )
    assert moved()
    JobRecord.objects.filter(job_id__in=(5, 6)).delete()
    assert moved()
    JobRecord.objects.filter(job_id=12345).update(name="none such")  # touches no row
    assert not moved()
    assert selectors.history_version(globex.organization) == others


def test_a_kept_answer_is_never_staler_than_the_database(
    acme: Tenant, as_member: APIClient, django_assert_max_num_queries: Any
) -> None:
    _record(1, "acme", state="RUNNING")
    query = {"fields": "state", "shape": "runs"}
    first = as_member.get("/api/v1/jobs", query).json()
    assert first["columns"]["state"] == ["RUNNING"]
    # Asked again with nothing changed: the kept answer, read without the history's rows
    # (the token, the version, nothing else).
    with django_assert_max_num_queries(1):
        assert as_member.get("/api/v1/jobs", query).json() == first
    JobRecord.objects.filter(job_id=1).update(state="COMPLETED")  # any writer at all
    assert as_member.get("/api/v1/jobs", query).json()["columns"]["state"] == ["COMPLETED"]
    _record(2, "acme", state="PENDING")
    assert as_member.get("/api/v1/jobs", query).json()["columns"]["job_id"] == [1, 2]


def test_answers_are_kept_per_organisation_and_query(
    acme: Tenant, as_member: APIClient, as_outsider: APIClient
) -> None:
    _record(1, "acme", state="RUNNING")
    _record(99, "globex", state="FAILED")
    query = {"fields": "state", "shape": "columns"}
    assert as_member.get("/api/v1/jobs", query).json()["columns"]["job_id"] == [1]
    assert as_outsider.get("/api/v1/jobs", query).json()["columns"]["job_id"] == [99]
    assert as_member.get("/api/v1/jobs", query).json()["columns"]["job_id"] == [1]
    rows = as_member.get("/api/v1/jobs", {"fields": "state"}).json()
    assert [job["state"] for job in rows["results"]] == ["RUNNING"]
    assert as_member.get("/api/v1/jobs", {"state": "FAILED"}).json()["results"] == []


def test_kept_answers_drop_the_least_recently_read_beyond_their_capacity() -> None:
    answers = kept.KeptAnswers(capacity=10)
    made: list[str] = []

    def make(key: str, size: int) -> Any:
        return lambda: (made.append(key) or size, f"answer {key}")

    assert answers.get("a", make("a", 4)) == "answer a"
    assert answers.get("b", make("b", 4)) == "answer b"
    assert answers.get("a", make("a", 4)) == "answer a"  # kept: not made again
    assert answers.get("c", make("c", 4)) == "answer c"  # 12 > 10: b, read least lately, goes
    assert answers.get("b", make("b", 4)) == "answer b"
    assert answers.get("big", make("big", 11)) == "answer big"  # larger than all: not kept
    assert answers.get("big", make("big", 11)) == "answer big"
    assert made == ["a", "b", "c", "b", "big", "big"]
    assert len(answers) == 2


def test_the_sqlite_triggers_move_the_version_of_the_rows_organisations() -> None:
    """The embedded platform's database: the migration's own statements, on SQLite."""
    db = sqlite3.connect(":memory:")
    db.execute(
        "CREATE TABLE jobs_jobrecord (id INTEGER PRIMARY KEY, organization_id INT, name TEXT)"
    )
    db.execute(
        "CREATE TABLE jobs_historyversion (organization_id INT PRIMARY KEY, version INT NOT NULL)"
    )
    for statement in MIGRATION._SQLITE:
        db.execute(statement)

    def versions() -> dict[int, int]:
        return dict(db.execute("SELECT organization_id, version FROM jobs_historyversion"))

    db.execute("INSERT INTO jobs_jobrecord (organization_id, name) VALUES (1, 'a'), (1, 'b')")
    start = versions()[1]
    assert versions() == {1: start}  # an organisation's first change sets it, then +1
    db.execute("INSERT INTO jobs_jobrecord (organization_id, name) VALUES (2, 'c')")
    other = versions()[2]
    db.execute("UPDATE jobs_jobrecord SET name = 'x' WHERE organization_id = 1")
    assert versions() == {1: start + 2, 2: other}  # a row trigger: once per row
    db.execute("UPDATE jobs_jobrecord SET organization_id = 1 WHERE name = 'c'")  # a move
    assert versions() == {1: start + 3, 2: other + 1}  # both sides of it
    db.execute("DELETE FROM jobs_jobrecord WHERE name = 'x'")
    assert versions() == {1: start + 5, 2: other + 1}
    for statement in MIGRATION._SQLITE_DROP:
        db.execute(statement)
    db.execute("DELETE FROM jobs_jobrecord")
    assert versions() == {1: start + 5, 2: other + 1}
