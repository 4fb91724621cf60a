"""The job's `ssh_keys` (scheduler/core/contract/ssh.py): OpenSSH public key lines of the
accepted types, bounded, checked on construction like every spec field, so nothing but
a well-formed short list reaches the log and the agent; and the login name of a job."""

from __future__ import annotations

import base64

import pytest

from scheduler.core.contract import JobSpec, ssh
from scheduler.core.errors import InvalidSpec

ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"


def blob(key_type: str, rest: bytes = b"\x00" * 36) -> str:
    name = key_type.encode()
    return base64.b64encode(len(name).to_bytes(4, "big") + name + rest).decode()


def test_a_job_carries_the_key_lines_it_was_given() -> None:
    rsa = f"ssh-rsa {blob('ssh-rsa')}"
    spec = JobSpec.from_dict({"script": "#!/bin/sh\n", "ssh_keys": [ED25519, rsa]})
    assert spec.ssh_keys == (ED25519, rsa)
    assert spec.to_dict()["ssh_keys"] == [ED25519, rsa]
    assert JobSpec(script="#!/bin/sh\n").ssh_keys == ()


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (ED25519 + " alice@laptop", "without options or comment"),
        ('command="sh" ' + ED25519, "without options or comment"),
        ("ssh-ed25519", "without options or comment"),
        (f"ssh-dss {blob('ssh-dss')}", "key type 'ssh-dss' is not one of"),
        ("ssh-ed25519 not*base64", "not base64"),
        ("ssh-ed25519 AAAA=A", "not base64"),
        (f"ssh-ed25519 {blob('ssh-rsa')}", "not a ssh-ed25519 key"),
        ("ssh-rsa " + "A" * 5000, "longer than 4096 characters"),
        ("-----BEGIN OPENSSH PRIVATE KEY-----", "without options or comment"),
    ],
)
def test_a_bad_key_line_is_refused_with_what_is_wrong(line: str, message: str) -> None:
    with pytest.raises(InvalidSpec, match=message) as refused:
        JobSpec.from_dict({"script": "#!/bin/sh\n", "ssh_keys": [ED25519, line]})
    assert refused.value.field == "ssh_keys"
    assert "ssh_keys[1]" in refused.value.message or "ssh_keys" in refused.value.message


def test_the_list_is_short_and_without_repeats() -> None:
    with pytest.raises(InvalidSpec, match="more than 20 items"):
        JobSpec(script="#!/bin/sh\n", ssh_keys=(ED25519,) * 21)
    with pytest.raises(InvalidSpec, match="listed twice"):
        JobSpec(script="#!/bin/sh\n", ssh_keys=(ED25519, ED25519))
    with pytest.raises(InvalidSpec, match="list of strings"):
        JobSpec.from_dict({"script": "#!/bin/sh\n", "ssh_keys": ED25519})


def test_a_login_name_names_a_job_and_nothing_else() -> None:
    assert ssh.login_name(42) == "job-42"
    assert ssh.job_of_login("job-42") == 42
    for name in ("job-042", "job-", "job-4x", "root", "job-42 ", "JOB-42", "job--1", "job-0",
                 "job-" + "9" * 19):  # fmt: skip
        assert ssh.job_of_login(name) is None, name
