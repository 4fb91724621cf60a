"""Launches and signals are signed for one node: anything unsigned, altered, expired or
addressed to another node is refused; only the controller's key makes a signature."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.rpc import signatures as s
from scheduler.rpc.errors import Refused

KEY = b"controller-signing-key"


def launch(**changes: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "job_id": 7,
        "attempt": 1,
        "node": "n1",
        "job": {"job_id": 7, "spec": {"script": "#!/bin/sh\ntrue\n"}},
    }
    payload.update(changes)
    return payload


def signed(payload: dict[str, Any], *, key: bytes = KEY, expires: float = 2000.0) -> Any:
    credential = s.node_key(key, str(payload["node"]))
    return s.sign(credential, "launch", s.launch_fields(payload), expires=expires)


def check(
    payload: dict[str, Any], signature: Any, *, node: str = "n1", now: float = 1000.0
) -> None:
    s.verify(
        s.node_key(KEY, node), "launch", s.launch_fields(payload), signature, node=node, now=now
    )


def test_the_leaders_signature_is_accepted() -> None:
    check(launch(), signed(launch()))


@pytest.mark.parametrize(
    ("signature_of", "sent", "code"),
    [
        (launch(), launch(job={"job_id": 7, "spec": {"script": "#!/bin/sh\nrm -rf /\n"}}),
         "bad_signature"),
        (launch(), launch(attempt=2), "bad_signature"),
        (launch(), launch(job_id=8), "bad_signature"),
    ],
)  # fmt: skip
def test_an_altered_launch_is_refused(signature_of: Any, sent: Any, code: str) -> None:
    with pytest.raises(Refused) as refused:
        check(sent, signed(signature_of))
    assert refused.value.code == code


def test_a_launch_for_another_node_is_refused_even_with_that_nodes_signature() -> None:
    other = launch(node="n2")
    with pytest.raises(Refused) as refused:
        check(other, signed(other))  # n2's valid signature, received by n1
    assert refused.value.code == "wrong_node"


def test_unsigned_malformed_forged_and_expired_launches_are_refused() -> None:
    cases = [
        (None, "unsigned"),
        ({"expires": "soon", "mac": "x"}, "bad_signature"),
        (signed(launch(), key=b"a guess"), "bad_signature"),
        (signed(launch(), expires=999.0), "expired"),
    ]
    for signature, code in cases:
        with pytest.raises(Refused) as refused:
            check(launch(), signature)
        assert refused.value.code == code


def test_node_credentials_differ_and_registration_proofs_bind_the_name() -> None:
    n1, n2 = s.node_key(KEY, "n1"), s.node_key(KEY, "n2")
    assert n1 != n2 and len(n1) == 32
    assert s.registration_proof(n1, "n1") != s.registration_proof(n1, "n2")
