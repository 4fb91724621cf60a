"""The slurmrestd translation layers against Slurm's own OpenAPI documents
(../shared/reference/slurmrestd/, read in place): every field of Slurm's job description
is translated or knowingly not honoured, our states are Slurm's, and what we answer
validates against Slurm's schemas. Also the translation of job descriptions itself,
including what it refuses. No database, no controller: the live routes are in
test_slurmrestd.py, which validates with `validate` from here."""

from __future__ import annotations

import copy
import functools
import json
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from scheduler.core.contract import JobSpec, JobState
from spurcloud.jobs import jobobject
from spurcloud.slurmrestd import cluster
from spurcloud.slurmrestd.envelope import VERSIONS, SlurmError, envelope
from spurcloud.slurmrestd.jobdesc import (
    LEGACY,
    NOT_HONOURED,
    TRANSLATED,
    check_spec,
    translate_submit,
)
from spurcloud.slurmrestd.jobinfo import job_info
from tests.spurcloud.conftest import job_dict

REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "reference" / "slurmrestd"
# v0.0.40 shares the shapes of v0.0.41 (its document is not in the reference).
DOCUMENT = {"v0.0.40": "v0.0.41", "v0.0.41": "v0.0.41", "v0.0.42": "v0.0.42"}

needs_reference = pytest.mark.skipif(
    not REFERENCE.is_dir(), reason=f"Slurm's OpenAPI documents are not at {REFERENCE}"
)


def _drop_path_requirements(node: Any) -> Any:
    """Slurm's generator writes a nested requirement as a path (`"nodes/count"`), which
    JSON Schema reads as a key with a slash in it that no answer (not even slurmrestd's)
    has. Those are dropped; every other requirement is kept."""
    if isinstance(node, dict):
        out = {k: _drop_path_requirements(v) for k, v in node.items()}
        if isinstance(out.get("required"), list):
            out["required"] = [r for r in out["required"] if "/" not in r]
        return out
    if isinstance(node, list):
        return [_drop_path_requirements(v) for v in node]
    return node


@functools.cache
def _document(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((REFERENCE / f"{name}.json").read_text())
    return doc


@functools.cache
def _components(name: str) -> dict[str, Any]:
    return dict(_drop_path_requirements(copy.deepcopy(_document(name)["components"])))


def schema_of(version: str, name: str) -> dict[str, Any]:
    doc = DOCUMENT[version]
    return dict(_document(doc)["components"]["schemas"][f"{doc}_{name}"])


def validate(version: str, name: str, instance: Any) -> None:
    """Raises unless `instance` is a valid `<name>` of Slurm's OpenAPI document."""
    doc = DOCUMENT[version]
    schema = {"$ref": f"#/components/schemas/{doc}_{name}", "components": _components(doc)}
    jsonschema.Draft4Validator(schema).validate(instance)


def _enum(version: str, name: str) -> set[str]:
    return set(schema_of(version, name)["items"]["enum"])


# -- the layers agree with Slurm's documents ------------------------------------------


@needs_reference
@pytest.mark.parametrize("version", ["v0.0.41", "v0.0.42"])
def test_every_field_of_slurms_job_description_is_translated_or_knowingly_not_honoured(
    version: str,
) -> None:
    slurm = set(schema_of(version, "job_desc_msg")["properties"])
    ours = set(TRANSLATED) | NOT_HONOURED
    assert slurm - ours == set(), "fields of Slurm's job description we do not know"
    assert not set(TRANSLATED) & NOT_HONOURED


@needs_reference
def test_every_field_we_know_is_one_of_slurms() -> None:
    slurm = set()
    for version in ("v0.0.41", "v0.0.42"):
        slurm |= set(schema_of(version, "job_desc_msg")["properties"])
    assert (set(TRANSLATED) | NOT_HONOURED) - slurm == set()
    assert set(LEGACY.values()) <= slurm and not set(LEGACY) & slurm


@needs_reference
@pytest.mark.parametrize("version", list(VERSIONS))
def test_our_states_are_slurms(version: str) -> None:
    assert {s.value for s in JobState} <= _enum(version, "job_state")
    assert {s for states in cluster.NODE_STATES.values() for s in states} <= _enum(
        version, "node_states"
    )


@needs_reference
@pytest.mark.parametrize("version", list(VERSIONS))
@pytest.mark.parametrize("state", list(JobState))
def test_a_job_in_every_state_is_a_valid_slurm_job_info(version: str, state: JobState) -> None:
    job = job_dict(7, tenant="acme", user="max", state=state.value)
    if state.is_terminal:
        job.update(exit_code=0 if state is JobState.COMPLETED else 1, end_time=time.time())
    if state is JobState.CANCELLED:
        job["signal"] = 15
    live = jobobject.from_controller(job)
    live["spec"] = JobSpec(
        script="#!/bin/sh\ntrue\n", cpus_per_task=4, gpus_per_node=2, tenant="acme", user="max"
    ).to_dict()
    info = job_info(live)
    validate(version, "job_info", info)
    assert info["job_state"] == [state.value]
    assert info["tres_per_node"] == "gres/gpu:2"
    assert info["time_limit"] == {"set": True, "infinite": False, "number": 60}
    if state is JobState.CANCELLED:
        assert info["exit_code"]["signal"] == {
            "id": {"set": True, "infinite": False, "number": 15},
            "name": "SIGTERM",
        }
    validate(
        version,
        "openapi_job_info_resp",
        envelope(version, {"jobs": [info], "last_backfill": {}, "last_update": {}}),
    )


def test_a_pending_jobs_start_time_is_when_it_is_expected_to_start() -> None:
    # "Time execution began, or is expected to begin": the leader's estimate, if any.
    expected = 1_800_000_000
    pending = jobobject.from_controller(
        job_dict(7, tenant="acme", user="max", expected_start=expected, sched_nodes=["n1"])
    )
    assert job_info(pending)["start_time"] == {"set": True, "infinite": False, "number": expected}
    unknown = jobobject.from_controller(job_dict(8, tenant="acme", user="max"))
    assert job_info(unknown)["start_time"] == {"set": False, "infinite": False, "number": 0}


@needs_reference
@pytest.mark.parametrize("version", list(VERSIONS))
def test_nodes_and_partitions_are_valid_slurm_answers(version: str) -> None:
    node = {
        "name": "node01",
        "state": "drain",
        "reason": "maintenance",
        "cpus": 16,
        "memory_mb": 64000,
        "sockets": 2,
        "cores_per_socket": 8,
        "threads_per_core": 1,
        "features": ["h100"],
        "partitions": ["gpu"],
        "cpus_alloc": 4,
        "memory_alloc_mb": 1000,
        "gpus_alloc": 1,
        "gpus": [{"index": 0, "vendor": "nvidia", "model": "h100", "memory_mb": 81920}],
    }
    slurm_node = cluster.node(node)
    assert slurm_node["state"] == ["IDLE", "DRAIN"]
    assert slurm_node["gres"] == "gpu:h100:1"
    validate(
        version,
        "openapi_nodes_resp",
        envelope(version, {"nodes": [slurm_node]} | {"last_update": {}}),
    )
    part = cluster.partition(
        {
            "name": "gpu",
            "default": True,
            "state": "up",
            "max_time_min": None,
            "default_time_min": 60,
            "nodes": ["node01"],
        },
        [node],
    )
    assert part["maximums"]["time"]["infinite"] is True
    assert part["cpus"]["total"] == 16
    validate(
        version,
        "openapi_partition_resp",
        envelope(version, {"partitions": [part], "last_update": {}}),
    )


# -- job descriptions -------------------------------------------------------------------

GOLDEN_SUBMIT = {  # as sent to Slurm 22.05 in slurm-golden/80_slurmrestd.txt (v0.0.38)
    "job": {
        "name": "rest",
        "partition": "gpu",
        "current_working_directory": "/home/alice/work",
        "environment": {"PATH": "/bin:/usr/bin"},
        "gres": "gpu:1",
        "standard_output": "/dev/null",
    },
    "script": "#!/bin/bash\nsleep 2",
}


def test_the_golden_submission_translates_with_warnings_for_its_old_names() -> None:
    t = translate_submit(GOLDEN_SUBMIT)
    assert t.spec == {
        "name": "rest",
        "partition": "gpu",
        "workdir": "/home/alice/work",
        "environment": {"PATH": "/bin:/usr/bin"},
        "gpus_per_node": 1,
        "stdout": "/dev/null",
        "script": "#!/bin/bash\nsleep 2",
    }
    assert {w["source"] for w in t.warnings} == {"#/job/gres", "#/script"}
    check_spec(t)


@needs_reference
@pytest.mark.parametrize("version", ["v0.0.41", "v0.0.42"])
def test_a_v004x_job_description_translates_field_by_field(version: str) -> None:
    body = {
        "job": {
            "script": "#!/bin/sh\ntrue\n",
            "name": "train",
            "partition": "gpu",
            "account": "acme",
            "qos": "normal",
            "comment": "hello",
            "argv": ["a", "b"],
            "environment": ["PATH=/bin", "EMPTY=", "EQ=a=b"],
            "current_working_directory": "/work/acme",
            "standard_output": "out-%j.txt",
            "standard_error": "err-%j.txt",
            "standard_input": "/dev/null",
            "time_limit": {"set": True, "infinite": False, "number": 30},
            "nodes": "2-4",
            "tasks_per_node": 2,
            "cpus_per_task": 4,
            "memory_per_node": {"set": True, "number": 2048},
            "tres_per_node": "gres/gpu:h100:2",
            "constraints": "h100",
            "required_nodes": ["node[01-02]"],
            "excluded_nodes": ["node03"],
            "array": "0-3%2",
            "dependency": "afterok:1",
            "hold": True,
            "begin_time": {"set": True, "number": 2_000_000_000},
            "nice": 5,
            "requeue": False,
            "mail_type": ["END"],
        }
    }
    validate(version, "job_submit_req", body)
    t = translate_submit(body)
    assert t.spec == {
        "script": "#!/bin/sh\ntrue\n",
        "name": "train",
        "partition": "gpu",
        "account": "acme",
        "qos": "normal",
        "comment": "hello",
        "argv": ["a", "b"],
        "environment": {"PATH": "/bin", "EMPTY": "", "EQ": "a=b"},
        "workdir": "/work/acme",
        "stdout": "out-%j.txt",
        "stderr": "err-%j.txt",
        "stdin": "/dev/null",
        "time_limit_min": 30,
        "nodes": 2,
        "ntasks": 4,
        "cpus_per_task": 4,
        "mem_per_node_mb": 2048,
        "gpus_per_node": 2,
        "gpu_type": "h100",
        "constraint": "h100",
        "nodelist": ["node01", "node02"],
        "exclude": ["node03"],
        "array": "0-3%2",
        "dependency": "afterok:1",
        "hold": True,
        "begin_time": 2_000_000_000.0,
        "nice": 5,
        "requeue": False,
    }
    assert [w["source"] for w in t.warnings] == ["#/job/mail_type"]
    spec = check_spec(t)
    assert (spec.nodes, spec.ntasks, spec.gpus_per_node) == (2, 4, 2)


@pytest.mark.parametrize(
    "job",
    [
        {"tres_per_job": "gres/gpu:4"},
        {"tres_per_node": "gres/shard:4"},
        {"time_limit": {"infinite": True}},
        {"time_limit": 5},
        {"exclusive": ["true"]},
        {"shared": ["none"]},
    ],
)
def test_other_spellings_translate(job: dict[str, Any]) -> None:
    t = translate_submit({"job": {"script": "#!/bin/sh\n", **job}})
    spec = check_spec(t)
    key = next(iter(job))
    expected = {
        "tres_per_job": ("gpus", 4),
        "tres_per_node": ("shards", 4),
        "time_limit": ("time_limit_min", 0 if isinstance(job[key], dict) else 5),
        "exclusive": ("exclusive", True),
        "shared": ("exclusive", True),
    }[key]
    assert getattr(spec, expected[0]) == expected[1]


@pytest.mark.parametrize(
    ("body", "source", "words"),
    [
        ([], "#", "JSON object"),
        ({"job": {"script": "#!/bin/sh\n"}, "extra": 1}, "#/extra", "Unknown field"),
        ({"job": {"script": "#!/bin/sh\n", "scrpit": "x"}}, "#/job/scrpit", "Unknown field"),
        ({"job": {"name": "x"}}, "#/job/script", "no script"),
        ({"jobs": [{"script": "#!/bin/sh\n"}]}, "#/jobs", "heterogeneous"),
        ({"job": {"script": 5}}, "#/job/script", "expected a string"),
        ({"job": {"script": "#!/bin/sh\n", "tasks": "4"}}, "#/job/tasks", "integer"),
        ({"job": {"script": "#!/bin/sh\n", "tasks": True}}, "#/job/tasks", "integer"),
        ({"job": {"script": "#!/bin/sh\n", "hold": "yes"}}, "#/job/hold", "true or false"),
        (
            {"job": {"script": "#!/bin/sh\n", "environment": ["NOEQUALS"]}},
            "#/job/environment[0]",
            "NAME=value",
        ),
        (
            {"job": {"script": "#!/bin/sh\n", "environment": [[[["deep"]]]]}},
            "#/job/environment",
            "list of strings",
        ),
        (
            {"job": {"script": "#!/bin/sh\n", "time_limit": {"number": 5, "x": 1}}},
            "#/job/time_limit",
            "unknown field",
        ),
        ({"job": {"script": "#!/bin/sh\n", "nodes": "lots"}}, "#/job/nodes", "node count"),
        (
            {"job": {"script": "#!/bin/sh\n", "tres_per_node": "gres/fpga:1"}},
            "#/job/tres_per_node",
            "invalid TRES",
        ),
        (
            {"job": {"script": "#!/bin/sh\n", "required_nodes": ["n[1-"]}},
            "#/job/required_nodes",
            "invalid hostlist",
        ),
        (
            {"job": {"script": "#!/bin/sh\n", "gres": "gpu:1", "tres_per_node": "gres/gpu:1"}},
            "#/job/gres",
            "not both",
        ),
    ],
)
def test_a_bad_job_description_is_refused_naming_the_field(
    body: Any, source: str, words: str
) -> None:
    with pytest.raises(SlurmError) as refused:
        translate_submit(body)
    assert refused.value.status == 400
    assert refused.value.source == source
    assert words in refused.value.description


@pytest.mark.parametrize(
    ("job", "source", "words"),
    [
        ({"time_limit": 10**12}, "#/job/time_limit", "time_limit must be at most"),
        ({"nodes": "0"}, "#/job/nodes", "nodes must be at least 1"),
        ({"tasks": 2**40}, "#/job/tasks", "at most"),
        ({"nice": -(10**9)}, "#/job/nice", "at least"),
        ({"memory_per_node": {"number": 2**62}}, "#/job/memory_per_node", "at most"),
        ({"name": "x" * 10_000}, "#/job/name", "longer than"),
        ({"script": ""}, "#/job/script", "empty"),
    ],
)
def test_absurd_numbers_and_texts_are_refused_by_the_contracts_bounds_in_slurms_words(
    job: dict[str, Any], source: str, words: str
) -> None:
    t = translate_submit({"job": {"script": "#!/bin/sh\n", **job}})
    with pytest.raises(SlurmError) as refused:
        check_spec(t)
    assert refused.value.source == source
    assert words in refused.value.description


class _Reads(dict[str, Any]):
    """A dict that records which keys are read."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self.read.add(str(key))
        return super().__contains__(key)


def test_the_translations_read_only_what_our_layers_define() -> None:
    """One fact, one place: job_info reads the contract's job object (`JOB_FIELDS`) and
    nothing else; a node, only what tenants are shown (`TENANT_NODE_KEYS`)."""
    from scheduler.core.contract import JOB_FIELDS
    from spurcloud.jobs.selectors import TENANT_GPU_KEYS, TENANT_NODE_KEYS

    job = _Reads(jobobject.from_controller(job_dict(7, tenant="acme", user="max")))
    job_info(job)
    assert job.read <= {f.name for f in JOB_FIELDS}
    gpu = _Reads({"index": 0, "vendor": "nvidia", "model": "h100", "memory_mb": 1})
    node = _Reads({"name": "node01", "state": "idle", "gpus": [gpu]})
    cluster.node(node)
    assert node.read <= set(TENANT_NODE_KEYS)
    assert gpu.read <= set(TENANT_GPU_KEYS)
