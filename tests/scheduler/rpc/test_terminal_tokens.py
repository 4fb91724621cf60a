"""Per-session terminal tokens (scheduler/rpc/terminal_tokens.py): forged, altered,
expired, another node's, another job's and another organisation's are refused."""

from __future__ import annotations

import pytest

from scheduler.rpc import signatures, terminal_tokens
from scheduler.rpc.errors import Unauthorized

KEY = b"the controllers' signing key"
NOW = 1_800_000_000.0
JOBS = {7: (1, "acme"), 8: (2, "globex")}  # what node sim01 runs: job -> (attempt, tenant)


def cred(node: str = "sim01", key: bytes = KEY) -> bytes:
    return signatures.node_key(key, node)


def mint(key: bytes = KEY, **changes: object) -> str:
    fields: dict[str, object] = {
        "job_id": 7, "attempt": 1, "node": "sim01", "tenant": "acme", "user": "max", "now": NOW,
    }  # fmt: skip
    fields.update(changes)
    return terminal_tokens.mint(cred(str(fields["node"]), key), **fields)  # type: ignore[arg-type]


def check(token: str, *, now: float = NOW, node: str = "sim01") -> dict[str, object]:
    return terminal_tokens.check(cred(node), token, node=node, jobs=JOBS, now=now)


def test_a_token_names_one_job_attempt_organisation_and_user_and_is_fresh_each_time() -> None:
    fields = check(mint())
    assert (fields["job_id"], fields["attempt"], fields["tenant"], fields["user"]) == (
        7, 1, "acme", "max",
    )  # fmt: skip
    assert fields["expires"] == int(NOW + terminal_tokens.TTL_S)
    assert mint() != mint()  # a nonce each: two tabs, two tokens
    assert check(mint(), now=NOW + terminal_tokens.TTL_S)  # good until it expires


def test_an_expired_token_is_refused() -> None:
    with pytest.raises(Unauthorized, match="expired"):
        check(mint(), now=NOW + terminal_tokens.TTL_S + 1)


def test_another_organisations_token_is_refused_for_this_job() -> None:
    with pytest.raises(Unauthorized, match="another organisation"):
        check(mint(tenant="globex"))  # globex's, naming acme's job 7
    with pytest.raises(Unauthorized, match="does not run here"):
        check(mint(job_id=8, attempt=1, tenant="globex"))  # an earlier attempt of job 8


def test_another_nodes_token_and_a_job_this_node_does_not_run_are_refused() -> None:
    with pytest.raises(Unauthorized):
        check(mint(node="sim02"))  # made with sim02's credential
    with pytest.raises(Unauthorized, match="does not run here"):
        check(mint(job_id=9))


TOKEN = mint()


def _altered(token: str) -> str:
    prefix, body, mac = token.split(".")
    return f"{prefix}.{body[:-2]}{'A' if body[-2] != 'A' else 'B'}{body[-1]}.{mac}"


@pytest.mark.parametrize(
    "given",
    [
        mint(key=b"another cluster"),  # forged: not made with this cluster's key
        _altered(TOKEN),  # its fields changed after signing
        TOKEN[:-1] + ("0" if not TOKEN.endswith("0") else "1"),  # its mac changed
        "spur-term.e30",  # no mac
        "spur-step.7.1.sim01.00",  # a step credential is no terminal token
        "Bearer x",
        "a" * 5000,
        "",
    ],
)
def test_a_forged_or_altered_token_is_refused(given: str) -> None:
    with pytest.raises(Unauthorized):
        check(given)


def test_a_service_token_and_a_terminal_token_do_not_stand_for_each_other() -> None:
    service = mint(kind=terminal_tokens.SERVICE)
    assert service.startswith("spur-svc.")
    fields = terminal_tokens.check(
        cred(), service, node="sim01", jobs=JOBS, now=NOW, kind=terminal_tokens.SERVICE
    )
    assert (fields["job_id"], fields["tenant"]) == (7, "acme")
    with pytest.raises(Unauthorized, match="not a terminal token"):
        check(service)
    with pytest.raises(Unauthorized, match="not a service token"):
        terminal_tokens.check(
            cred(), mint(), node="sim01", jobs=JOBS, now=NOW, kind=terminal_tokens.SERVICE
        )
    # The kind is under the MAC too: a terminal token relabelled is no service token.
    relabelled = "spur-svc." + mint().split(".", 1)[1]
    with pytest.raises(Unauthorized, match="invalid service token"):
        terminal_tokens.check(
            cred(), relabelled, node="sim01", jobs=JOBS, now=NOW, kind=terminal_tokens.SERVICE
        )
