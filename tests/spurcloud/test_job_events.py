"""The job history mirrors controller events: newer events win, duplicates and reordering
change nothing."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from scheduler.core.contract import JobState
from spurcloud.jobs.models import JobRecord
from spurcloud.jobs.services import record_job_event
from spurcloud.jobs.tasks import job_events
from tests.spurcloud.conftest import Tenant, event, job_dict


def _job(acme: Tenant, job_id: int = 7, **changes: Any) -> dict[str, Any]:
    return job_dict(job_id, tenant="acme", user=acme.member.username, **changes)


def test_the_first_event_of_a_job_creates_its_record(acme: Tenant) -> None:
    record = record_job_event(event=event(_job(acme), seq=5))
    assert record is not None
    assert record.organization == acme.organization
    assert (record.job_id, record.state, record.last_seq, record.user) == (7, "PENDING", 5, "max")
    assert record.submit_time is not None and record.submit_time.tzinfo is not None


def test_a_newer_event_updates_the_record(acme: Tenant) -> None:
    record_job_event(event=event(_job(acme), seq=5))
    running = _job(
        acme,
        state="RUNNING",
        reason="None",
        start_time=1_700_000_000.5,
        nodes=["node01"],
        allocation={"node01": {"gpus": [0, 1], "cpus": 4, "mem_mb": 1000}},
    )
    record = record_job_event(event=event(running, seq=9))
    assert record is not None
    assert record.state == JobState.RUNNING
    assert record.start_time == datetime.fromtimestamp(1_700_000_000.5, tz=UTC)
    assert record.nodes == ["node01"]
    assert record.allocation["node01"]["gpus"] == [0, 1]


def test_an_older_event_arriving_late_changes_nothing(acme: Tenant) -> None:
    record_job_event(event=event(_job(acme, state="COMPLETED", exit_code=0), seq=12))
    assert record_job_event(event=event(_job(acme, state="RUNNING"), seq=11)) is None
    record = JobRecord.objects.get(job_id=7)
    assert (record.state, record.exit_code, record.last_seq) == ("COMPLETED", 0, 12)


def test_a_duplicate_event_changes_nothing(acme: Tenant) -> None:
    first = event(_job(acme, state="RUNNING"), seq=20)
    assert record_job_event(event=first) is not None
    before = JobRecord.objects.get(job_id=7).updated_at
    assert record_job_event(event=first) is None
    assert JobRecord.objects.get(job_id=7).updated_at == before
    assert JobRecord.objects.count() == 1


def test_an_update_is_one_conditional_statement(acme: Tenant) -> None:
    record_job_event(event=event(_job(acme), seq=1))
    with CaptureQueriesContext(connection) as queries:
        record_job_event(event=event(_job(acme, state="RUNNING"), seq=2))
    updates = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("UPDATE")]
    assert len(updates) == 1
    assert '"last_seq" <' in updates[0]


def test_events_of_an_unknown_organisation_are_dropped(db: None) -> None:
    job = job_dict(3, tenant="nobody", user="x")
    assert record_job_event(event=event(job, seq=1)) is None
    assert not JobRecord.objects.exists()


def test_an_overlong_reason_is_cut_to_fit(acme: Tenant) -> None:
    record = record_job_event(event=event(_job(acme, reason="x" * 500), seq=1))
    assert record is not None and len(record.reason) == 200


def test_the_event_task_records_a_batch_and_reports_how_many_jobs_changed(
    acme: Tenant,
) -> None:
    running = event(_job(acme, state="RUNNING"), seq=30)
    done = event(_job(acme, state="COMPLETED", exit_code=0), seq=31)
    assert job_events([done, running]) == 1  # out of order in the batch: newest wins
    assert job_events([running, done]) == 0
    assert JobRecord.objects.get(job_id=7).state == "COMPLETED"


def test_an_event_the_record_already_holds_opens_no_write_transaction(acme: Tenant) -> None:
    """The `submitted` event of a job whose record the submission wrote (with its seq):
    the mirror reads, and writes nothing (no savepoint, no UPDATE, no metering lock)."""
    record_job_event(event=event(_job(acme), seq=5))  # as the submission writes it
    with CaptureQueriesContext(connection) as queries:
        assert job_events([event(_job(acme), seq=5, kind="submitted")]) == 0
    statements = [q["sql"] for q in queries.captured_queries]
    assert [q for q in statements if not q.startswith("SELECT")] == []
    assert len(statements) <= 3  # the records' seqs, the organisations, their open runs
    assert all("FOR UPDATE" not in q for q in statements)


def test_a_newer_event_in_the_same_batch_is_still_written(acme: Tenant) -> None:
    record_job_event(event=event(_job(acme), seq=5))
    running = _job(acme, state="RUNNING", reason="None", start_time=1_700_000_000.0, attempt=1)
    assert job_events([event(_job(acme), seq=5), event(running, seq=6)]) == 1
    assert JobRecord.objects.get(job_id=7).state == "RUNNING"


def test_the_event_task_is_registered_under_its_wire_name() -> None:
    from spurcloud.celery import app

    assert {"spur.job_events", "spur.launch_jobs", "spur.signal_job"} <= set(app.tasks)


def test_an_array_task_event_keeps_its_array_ids(acme: Tenant) -> None:
    job = _job(acme, state="RUNNING")
    job.update({"array_job_id": 7, "array_task_id": 3})
    record = record_job_event(event=event(job, seq=40))
    assert record is not None and (record.array_job_id, record.array_task_id) == (7, 3)


@pytest.mark.parametrize("existing", [False, True], ids=["new row", "existing row"])
def test_a_preempted_job_is_recorded_as_preempted(acme: Tenant, existing: bool) -> None:
    if existing:
        record_job_event(event=event(_job(acme, state="RUNNING"), seq=50))
    assert job_events([event(_job(acme, state="PREEMPTED", signal=15), seq=51)]) == 1
    assert JobRecord.objects.get(job_id=7).state == JobState.PREEMPTED


def test_an_event_the_database_refuses_is_logged_and_never_blocks_the_others(
    acme: Tenant, caplog: pytest.LogCaptureFixture
) -> None:
    record_job_event(event=event(_job(acme, 8, state="RUNNING"), seq=60))
    before = event(_job(acme, 6, state="COMPLETED", exit_code=0), seq=61)
    # A state the history's constraint does not know, on an existing and on a new row.
    refused = [
        event(_job(acme, 8, state="BOOT_FAIL"), seq=62),
        event(_job(acme, 9, state="BOOT_FAIL"), seq=63),
    ]
    after = event(_job(acme, 10, state="FAILED", exit_code=2), seq=64)
    with caplog.at_level(logging.ERROR, logger="spurcloud.jobs.services"):
        assert job_events([before, *refused, after]) == 2
    states = dict(JobRecord.objects.values_list("job_id", "state"))
    assert states == {6: "COMPLETED", 8: "RUNNING", 10: "FAILED"}
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "job 8: event seq 62" in logged and "job 9: event seq 63" in logged


def test_the_event_task_pushes_each_changed_job_to_its_organisations_group(
    acme: Tenant, settings: Any
) -> None:
    from asgiref.sync import async_to_sync
    from channels.layers import channel_layers, get_channel_layer

    from spurcloud.jobs.live import organization_group

    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.CHANNEL_LAYER_IN_MEMORY = False  # as if it were the shared (Redis) layer
    channel_layers.backends.pop("default", None)
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(organization_group(acme.organization.pk), channel)
    batch = [event(_job(acme, job_id), seq=40 + job_id) for job_id in (7, 8, 9)]
    assert job_events(batch) == 3
    pushed = [async_to_sync(layer.receive)(channel) for _ in batch]
    assert [(m["type"], m["job"]["job_id"]) for m in pushed] == [
        ("job.update", 7),
        ("job.update", 8),
        ("job.update", 9),
    ]
    channel_layers.backends.pop("default", None)


def test_a_batch_reads_its_changed_records_once_whatever_its_size(
    acme: Tenant, settings: Any
) -> None:
    """An event of a job with a record is its conditional UPDATE; the records that changed
    are read back together for the portal's push, not one SELECT an event, and not at all
    where nothing is pushed (the in-memory layer of the embedded platform)."""
    for in_memory, reads in ((False, 2), (True, 1)):  # the seqs held (, the changed records)
        settings.CHANNEL_LAYER_IN_MEMORY = in_memory
        selects = []
        for size in (2, 6):
            ids = range(100 * size + 1000 * in_memory, 100 * size + size + 1000 * in_memory)
            for job_id in ids:
                record_job_event(event=event(_job(acme, job_id), seq=5))
            running = [event(_job(acme, job_id, state="RUNNING"), seq=6) for job_id in ids]
            with CaptureQueriesContext(connection) as queries:
                assert job_events(running) == size
            statements = [q["sql"] for q in queries.captured_queries]
            updates = [q for q in statements if q.startswith("UPDATE") and "jobs_jobrecord" in q]
            assert len(updates) == size
            selects.append(
                sum(q.startswith("SELECT") and "jobs_jobrecord" in q for q in statements)
            )
        assert selects == [reads, reads]


def test_a_batch_writes_each_record_as_its_events_one_task_each_would(acme: Tenant) -> None:
    """In order of seq whatever the order of the batch, a duplicate and an older event
    changing nothing, an event that leaves a key out leaving that column alone, and an
    event the database refuses taking nothing else with it."""

    def job(job_id: int, **changes: Any) -> dict[str, Any]:
        return _job(acme, job_id, submit_time=1_699_999_000, eligible_time=1_699_999_000, **changes)

    def events(first: int) -> list[dict[str, Any]]:
        a, b, c = first, first + 1, first + 2
        no_reason = job(b, state="RUNNING", start_time=1_700_000_100.25, nodes=["n1"])
        del no_reason["reason"]
        return [
            event(job(a), seq=1),
            event(job(b, reason="Resources"), seq=2),
            event(job(a, state="RUNNING", start_time=1_700_000_000.5), seq=3),
            event(no_reason, seq=4),
            event(job(c, state="BOOT_FAIL"), seq=5),  # refused: no such state here
            event(job(a, state="COMPLETED", exit_code=3, end_time=1_700_000_060), seq=7),
            event(job(a, state="RUNNING"), seq=6),  # older than what a holds by then
            event(job(b, reason="Resources"), seq=2),  # a duplicate
            event(job(c, state="CANCELLED", signal=15, allocation={"n2": {}}), seq=8),
        ]

    assert job_events(list(reversed(events(10)))) == 3
    for one in events(20):
        job_events([one])

    def stored(first: int) -> list[dict[str, Any]]:
        rows = JobRecord.objects.filter(job_id__gte=first, job_id__lt=first + 3).order_by("job_id")
        left_out = {"id", "job_id", "name", "created_at", "updated_at"}
        return [{k: v for k, v in row.items() if k not in left_out} for row in rows.values()]

    assert stored(10) == stored(20)
    assert [(r["state"], r["reason"], r["last_seq"]) for r in stored(10)] == [
        ("COMPLETED", "Priority", 7),
        ("RUNNING", "Resources", 4),
        ("CANCELLED", "Priority", 8),
    ]


def test_with_the_in_memory_layer_the_worker_pushes_nothing(acme: Tenant, settings: Any) -> None:
    """A worker's in-memory layer reaches no consumer (they live in the web process, and
    poll): the event task spends nothing on it."""
    from asgiref.sync import async_to_sync
    from channels.layers import channel_layers, get_channel_layer

    from spurcloud.jobs.live import organization_group

    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.CHANNEL_LAYER_IN_MEMORY = True
    channel_layers.backends.pop("default", None)
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(organization_group(acme.organization.pk), channel)
    assert job_events([event(_job(acme, 7), seq=50)]) == 1
    assert layer.channels.get(channel) is None or layer.channels[channel].empty()
    channel_layers.backends.pop("default", None)


def test_a_worker_pushes_batch_after_batch_in_order_on_one_kept_loop(acme: Tenant) -> None:
    """Through the shared (Redis) layer, from several worker threads: every job arrives,
    in order, and all pushes run on the process's one sending loop (a thread of its own),
    not on a loop (and a connection) made for each push."""
    import threading

    from asgiref.sync import async_to_sync
    from channels.layers import channel_layers, get_channel_layer

    from spurcloud.jobs.live import organization_group, push_jobs
    from spurcloud.jobs.services import job_records

    channel_layers.backends.pop("default", None)
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(organization_group(acme.organization.pk), channel)
    for job_id in range(1, 6):
        record_job_event(event=event(_job(acme, job_id), seq=job_id))
    batches = [job_records(job_ids=[3, 1, 2]), job_records(job_ids=[5, 4])]
    push_jobs(batches[0][:1])  # the first push makes the loop

    def worker() -> None:
        for batch in batches:
            push_jobs(batch)

    for _ in range(2):
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
    assert [t.name for t in threading.enumerate()].count("portal-push") == 1

    async def receive(count: int) -> list[int]:
        return [(await layer.receive(channel))["job"]["job_id"] for _ in range(count)]

    pushed = async_to_sync(receive)(11)
    assert pushed == [3, 3, 1, 2, 5, 4, 3, 1, 2, 5, 4]
    async_to_sync(layer.group_discard)(organization_group(acme.organization.pk), channel)
