"""What an agent runs is what the leader decided: launches and signals signed for one node.

The controller replicas share a signing key that nothing else has (not the web, not the
workers, not the agents). Each node's credential is derived from it, `node_key(key,
name)`, and given to the node when it first registers (or provisioned by an operator
ahead of time); a node that registers again proves it holds its credential. The leader
signs every launch and signal it dispatches over (job, attempt, node, what it asks,
expiry) with the node's credential; the agent checks the signature, the node and the
expiry. A leaked cluster token, or a worker, can carry a launch but never make one:
the agent refuses anything unsigned, expired, altered or addressed to another node, and
a replayed launch is the duplicate its (job, attempt) key already makes harmless.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any

from scheduler.rpc.errors import Refused, Unauthorized

LAUNCH_TTL_S = 1800.0  # a launch task may wait out its retries (minutes) before it lands


def node_key(signing_key: bytes, node: str) -> bytes:
    return hmac.new(signing_key, b"spur-node:" + node.encode(), hashlib.sha256).digest()


def registration_proof(credential: bytes, node: str) -> str:
    return hmac.new(credential, b"register:" + node.encode(), hashlib.sha256).hexdigest()


def _digest(value: Any) -> str:
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _message(kind: str, fields: Mapping[str, Any]) -> bytes:
    return json.dumps([kind, dict(fields)], sort_keys=True, separators=(",", ":")).encode()


def launch_fields(payload: Mapping[str, Any]) -> dict[str, Any]:
    """What a launch's signature covers: which job, attempt and node, the node's epoch
    (a launch from before the node was last declared lost is stale), and the whole job
    (its spec and allocation) by digest."""
    return {
        "job_id": payload.get("job_id"),
        "attempt": payload.get("attempt"),
        "node": payload.get("node"),
        "epoch": payload.get("epoch", 0),
        "job": _digest(payload.get("job")),
    }


def signal_fields(payload: Mapping[str, Any], job_id: int) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "attempt": payload.get("attempt"),
        "node": payload.get("node"),
        "signal": payload.get("signal"),
        "kill_after_s": payload.get("kill_after_s"),
        "step_id": payload.get("step_id"),
    }


# -- job steps (srun) ----------------------------------------------------------------------

STEP_TTL_S = 120.0  # srun sends a step's launches to its nodes at once
STEP_TOKEN_PREFIX = "spur-step"


def step_launch_fields(payload: Mapping[str, Any]) -> dict[str, Any]:
    """What a step launch's signature covers: job, attempt, step, node, and by digest the
    whole step (command, environment, tasks) and the job (its spec and allocation)."""
    return {
        "job_id": payload.get("job_id"),
        "attempt": payload.get("attempt"),
        "step_id": payload.get("step_id"),
        "node": payload.get("node"),
        "step": _digest(payload.get("step")),
        "job": _digest(payload.get("job")),
    }


def step_token(credential: bytes, node: str, job_id: int, attempt: int) -> str:
    """The job's step credential: made by the agent of the node that runs the job's batch
    script (with its node credential) and put in the job's environment; the controller
    recomputes it from the signing key. It names one job attempt and is accepted only
    while that attempt runs, only to create, finish or cancel its own steps."""
    mac = hmac.new(
        credential, f"step-token:{job_id}:{attempt}:{node}".encode(), hashlib.sha256
    ).hexdigest()
    return f"{STEP_TOKEN_PREFIX}.{job_id}.{attempt}.{node}.{mac}"


def check_step_token(signing_key: bytes, token: str) -> tuple[int, int, str]:
    """`(job_id, attempt, node)` of a step credential the controller made the key for;
    Refused (401) otherwise. Whether that job attempt runs is the caller's to check."""
    parts = token.split(".") if len(token) <= 400 else []
    if len(parts) != 5 or parts[0] != STEP_TOKEN_PREFIX:
        raise Unauthorized("not a step credential")
    _, job, attempt, node, mac = parts
    if not (job.isdigit() and attempt.isdigit() and len(job) <= 18 and len(attempt) <= 9):
        raise Unauthorized("not a step credential")
    expected = step_token(node_key(signing_key, node), node, int(job), int(attempt))
    if not hmac.compare_digest(expected.encode(), token.encode()):
        raise Unauthorized("invalid step credential")
    return int(job), int(attempt), node


STEP_IO_PREFIX = "spur-stepio"


def step_io_token(credential: bytes, node: str, job_id: int, attempt: int, step_id: int) -> str:
    """A step's I/O credential on one node: what lets srun (or the web, carrying it for
    srun) attach to the step's stream there again, write its input and resize or signal
    its tasks. The controller makes it with the node's credential when it creates the
    step and gives it only to the step's creator; the agent checks it with its own. It
    names one step of one job attempt on one node, and is worth nothing once the step
    has left the node."""
    mac = hmac.new(
        credential, f"step-io:{job_id}:{attempt}:{step_id}:{node}".encode(), hashlib.sha256
    ).hexdigest()
    return f"{STEP_IO_PREFIX}.{job_id}.{attempt}.{step_id}.{node}.{mac}"


def check_step_io_token(credential: bytes, token: str, *, node: str) -> tuple[int, int, int]:
    """`(job_id, attempt, step_id)` of a step I/O credential made for this node with its
    credential; Unauthorized (401) otherwise."""
    parts = token.split(".") if len(token) <= 400 else []
    if len(parts) != 6 or parts[0] != STEP_IO_PREFIX:
        raise Unauthorized("not a step I/O credential")
    _, job, attempt, step, named, _mac = parts
    if not all(v.isdigit() and len(v) <= 18 for v in (job, attempt, step)):
        raise Unauthorized("not a step I/O credential")
    if named != node:
        raise Unauthorized(f"this step I/O credential is for node {named!r}, not {node}")
    expected = step_io_token(credential, node, int(job), int(attempt), int(step))
    if not hmac.compare_digest(expected.encode(), token.encode()):
        raise Unauthorized("invalid step I/O credential")
    return int(job), int(attempt), int(step)


def sign(
    credential: bytes, kind: str, fields: Mapping[str, Any], *, expires: float
) -> dict[str, Any]:
    """The `signature` object a payload carries."""
    stamped = {**fields, "expires": int(expires)}
    mac = hmac.new(credential, _message(kind, stamped), hashlib.sha256).hexdigest()
    return {"expires": int(expires), "mac": mac}


def verify(
    credential: bytes,
    kind: str,
    fields: Mapping[str, Any],
    signature: Any,
    *,
    node: str,
    now: float,
) -> None:
    """Raise Refused unless `signature` is the leader's over these fields, for this node,
    and not expired."""
    if not isinstance(signature, dict):
        raise Refused(f"unsigned {kind}: this agent runs only what the controller signed",
                      code="unsigned")  # fmt: skip
    expires, mac = signature.get("expires"), signature.get("mac")
    if isinstance(expires, bool) or not isinstance(expires, int) or not isinstance(mac, str):
        raise Refused(f"malformed {kind} signature", code="bad_signature")
    if fields.get("node") != node:
        raise Refused(f"{kind} addressed to node {fields.get('node')!r}, not {node}",
                      code="wrong_node")  # fmt: skip
    expected = sign(credential, kind, fields, expires=expires)["mac"]
    if not hmac.compare_digest(expected, mac):
        raise Refused(f"{kind} signature does not match", code="bad_signature")
    if now > expires:
        raise Refused(f"{kind} signature expired", code="expired")


__all__ = [
    "LAUNCH_TTL_S",
    "STEP_TTL_S",
    "launch_fields",
    "node_key",
    "registration_proof",
    "check_step_io_token",
    "check_step_token",
    "sign",
    "signal_fields",
    "step_io_token",
    "step_launch_fields",
    "step_token",
    "verify",
]
