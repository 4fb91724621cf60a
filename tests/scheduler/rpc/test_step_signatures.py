"""The job step credential and the signed step launch (scheduler/rpc/signatures.py)."""

from __future__ import annotations

import pytest

from scheduler.rpc import signatures
from scheduler.rpc.errors import Refused, Unauthorized

KEY = b"the controllers' signing key"


def token(job: int, attempt: int = 1, node: str = "sim01", key: bytes = KEY) -> str:
    return signatures.step_token(signatures.node_key(key, node), node, job, attempt)


def test_a_credential_names_one_job_attempt_and_the_node_that_made_it():
    assert signatures.check_step_token(KEY, token(7)) == (7, 1, "sim01")
    assert token(7) != token(8) and token(7) != token(7, attempt=2)
    assert token(7) != token(7, node="sim02")


@pytest.mark.parametrize(
    "given",
    [
        token(7).replace(".7.", ".8.", 1),  # another job's id on this job's mac
        token(7, key=b"another cluster"),  # not made with this cluster's key
        token(7)[:-1] + ("0" if not token(7).endswith("0") else "1"),  # altered
        token(7).replace("sim01", "sim02"),  # another node
        "spur-step.7.1.sim01",  # no mac
        "Bearer x",
        "spur-step.x.1.sim01.00",
        "spur-step." + "9" * 30 + ".1.sim01.00",
        "a" * 1000,
        "",
    ],
)
def test_a_forged_or_altered_credential_is_refused(given):
    with pytest.raises(Unauthorized):
        signatures.check_step_token(KEY, given)


def test_a_step_launch_is_signed_over_the_step_and_the_job():
    payload = {
        "job_id": 7,
        "attempt": 1,
        "step_id": 0,
        "node": "sim01",
        "step": {"argv": ["hostname"], "tasks": [[0, 0, []]]},
        "job": {"job_id": 7, "nodes": ["sim01"]},
    }
    credential = signatures.node_key(KEY, "sim01")
    fields = signatures.step_launch_fields(payload)
    signature = signatures.sign(credential, "step", fields, expires=2000)
    signatures.verify(credential, "step", fields, signature, node="sim01", now=1000)
    for change in (
        {"step": {"argv": ["id"], "tasks": [[0, 0, []]]}},
        {"job": {"job_id": 7, "nodes": ["sim01"], "allocation": {"sim01": {"gpus": [0]}}}},
        {"step_id": 1},
        {"attempt": 2},
    ):
        altered = signatures.step_launch_fields({**payload, **change})
        with pytest.raises(Refused):
            signatures.verify(credential, "step", altered, signature, node="sim01", now=1000)
    with pytest.raises(Refused):  # signed as a launch, not a step
        signatures.verify(credential, "launch", fields, signature, node="sim01", now=1000)
    with pytest.raises(Refused):
        signatures.verify(credential, "step", fields, signature, node="sim01", now=2001)
    with pytest.raises(Refused):
        signatures.verify(credential, "step", fields, signature, node="sim02", now=1000)


# -- a step's I/O credential (srun's attach, input, resize, signal) -------------------------

SIM01 = signatures.node_key(KEY, "sim01")


def io(job: int = 7, attempt: int = 1, step: int = 0, node: str = "sim01") -> str:
    return signatures.step_io_token(signatures.node_key(KEY, node), node, job, attempt, step)


def test_an_io_credential_names_one_step_of_one_job_attempt_on_one_node():
    assert signatures.check_step_io_token(SIM01, io(), node="sim01") == (7, 1, 0)
    assert len({io(), io(job=8), io(attempt=2), io(step=1), io(node="sim02")}) == 5


@pytest.mark.parametrize(
    "given",
    [
        io().replace(".7.1.0.", ".7.1.1.", 1),  # another step on this step's mac
        io().replace(".7.1.0.", ".8.1.0.", 1),  # another job
        io().replace(".7.1.0.", ".7.2.0.", 1),  # another attempt
        io(node="sim02"),  # another node's, however well made
        io(node="sim02").replace("sim02", "sim01"),  # another node's mac, renamed
        io()[:-1] + ("0" if not io().endswith("0") else "1"),  # altered
        signatures.step_io_token(signatures.node_key(b"elsewhere", "sim01"), "sim01", 7, 1, 0),
        token(7),  # the job's step credential is not a step's I/O credential
        "spur-stepio.7.1.0.sim01",
        "spur-stepio.x.1.0.sim01." + "0" * 64,
        "a" * 1000,
        "",
    ],
)
def test_a_forged_or_another_steps_io_credential_is_refused(given):
    with pytest.raises(Unauthorized):
        signatures.check_step_io_token(SIM01, given, node="sim01")
