"""The client of the controller API (docs/architecture.md, "Controller API").

Used by the web app (submit, actions, the live queue, nodes), the agents (register,
heartbeat, reports) and tests. It is `RpcClient` with the controller's calls typed: it
knows every replica, moves on when one cannot be reached, and raises the errors of
`scheduler.rpc.errors`; any replica accepts writes (Raft forwards them to the leader).
Heartbeats are the leader's alone (it alone keeps the nodes' clocks): a follower answers
one with 503 `not_leader`, so the client moves on to the next replica and stays with the
one that took it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote

from scheduler.core.contract import JobAction
from scheduler.rpc.client import RpcClient
from scheduler.rpc.errors import RpcError, error_for

# Submissions in one `POST /v1/jobs/batch` (the web API's bulk submit takes at most as
# many: API_MAX_BULK_SUBMIT).
MAX_SUBMIT_BATCH = 1000
# Reports in one `POST /v1/reports` (an agent's queue sends at most as many at once).
MAX_REPORT_BATCH = 256


@dataclass(frozen=True)
class JobReport:
    """An agent's report on one attempt of a job on its node: it `started` (with the
    batch script's pid) or `finished` (with its exit). The controller's
    `POST /v1/jobs/{id}/{kind}` takes `body()`; reports are idempotent by (job, attempt)."""

    kind: Literal["started", "finished"]
    job_id: int
    attempt: int
    node: str
    pid: int = 0
    limits: str = ""  # started: how memory and process limits are enforced
    exit_code: int = 0
    signal: int = 0
    reason: str = ""
    oom: bool = False  # finished: killed for exceeding its memory

    def body(self) -> dict[str, Any]:
        if self.kind == "started":
            return {"attempt": self.attempt, "node": self.node, "pid": self.pid,
                    "limits": self.limits}  # fmt: skip
        return {
            "attempt": self.attempt,
            "node": self.node,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "reason": self.reason,
            "oom": self.oom,
        }

    def to_dict(self) -> dict[str, Any]:
        """All of it, as the agent's outbox keeps it (`from_dict` reads it back)."""
        return {"kind": self.kind, "job_id": self.job_id, **self.body()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobReport:
        kind = data["kind"]
        if kind not in ("started", "finished"):
            raise ValueError(f"unknown report kind {kind!r}")
        return cls(
            kind,
            int(data["job_id"]),
            int(data["attempt"]),
            str(data["node"]),
            pid=int(data.get("pid", 0)),
            limits=str(data.get("limits", "")),
            exit_code=int(data.get("exit_code", 0)),
            signal=int(data.get("signal", 0)),
            reason=str(data.get("reason", "")),
            oom=bool(data.get("oom", False)),
        )


class ControllerClient(RpcClient):
    # -- jobs ---------------------------------------------------------------------

    def submit(self, spec: dict[str, Any], *, idempotency_key: str = "") -> dict[str, Any]:
        """The new job (its first task, for an array), as the job dict with its spec."""
        body: dict[str, Any] = {"spec": spec}
        if idempotency_key:
            body["idempotency_key"] = idempotency_key
        job: dict[str, Any] = self.call("POST", "/v1/jobs", json=body)["job"]
        return job

    def submit_many(
        self, submissions: Iterable[tuple[dict[str, Any], str]]
    ) -> list[dict[str, Any] | RpcError]:
        """Several (spec, idempotency key) committed together: each new job (its job
        dict with its spec), or the error that refused that one alone. Refused (400) for
        them all when any spec is invalid."""
        body = {"jobs": [{"spec": spec, "idempotency_key": key} for spec, key in submissions]}
        results = self.call("POST", "/v1/jobs/batch", json=body)["results"]
        out: list[dict[str, Any] | RpcError] = []
        for result in results:
            error = result.get("error")
            if error is not None:
                out.append(error_for(int(error["status"]), str(error["detail"]), error["code"]))
            else:
                out.append(result["job"])
        return out

    def jobs(
        self,
        *,
        tenant: str | None = None,
        states: Iterable[str] | None = None,
        ids: Iterable[int] | None = None,
        users: Iterable[str] = (),
        names: Iterable[str] = (),
        accounts: Iterable[str] = (),
        partitions: Iterable[str] = (),
        ended_after: float | None = None,
        fields: Iterable[str] | None = None,
    ) -> list[dict[str, Any]]:
        """The jobs that match every filter given (`Controller.jobs`), in job id order,
        cut to `fields` where given (the job id comes always)."""
        params = _job_filters(
            tenant, states, ids, users, names, accounts, partitions, ended_after, fields
        )
        jobs: list[dict[str, Any]] = self.call("GET", "/v1/jobs", params=params)["jobs"]
        return jobs

    def job_columns(
        self,
        *,
        fields: Iterable[str],
        tenant: str | None = None,
        states: Iterable[str] | None = None,
        ids: Iterable[int] | None = None,
        users: Iterable[str] = (),
        names: Iterable[str] = (),
        accounts: Iterable[str] = (),
        partitions: Iterable[str] = (),
        ended_after: float | None = None,
        runs: bool = False,
    ) -> bytes:
        """The same jobs as a columns answer (`contract.job_object.to_columns`), in runs
        where `runs` (`contract.runs`), as the JSON text the controller sent: the web
        passes it on without reading it."""
        params = _job_filters(
            tenant, states, ids, users, names, accounts, partitions, ended_after, fields
        )
        params.append(("shape", "runs" if runs else "columns"))
        return self.call_bytes("GET", "/v1/jobs", params=params)

    def job(self, job_id: int, *, tenant: str | None = None) -> dict[str, Any]:
        params = {"tenant": tenant} if tenant is not None else {}
        job: dict[str, Any] = self.call("GET", f"/v1/jobs/{int(job_id)}", params=params)
        return job

    def act(
        self,
        job_id: int,
        action: JobAction,
        *,
        tenant: str | None = None,
        signal: int | None = None,
        admin: bool = False,
        by: str = "",
    ) -> dict[str, Any]:
        """One of the contract's job actions; the job as it is afterwards."""
        body: dict[str, Any] = {"admin": admin, "by": by}
        if tenant is not None:
            body["tenant"] = tenant
        if signal is not None:
            body["signal"] = signal
        job: dict[str, Any] = self.call(
            "POST", f"/v1/jobs/{int(job_id)}/{JobAction(action).value}", json=body
        )
        return job

    def update(
        self,
        job_id: int,
        changes: dict[str, Any],
        *,
        tenant: str | None = None,
        admin: bool = False,
    ) -> dict[str, Any]:
        """scontrol update: change a pending job's fields (contract.update.UPDATE_FIELDS);
        the job as it is afterwards."""
        body: dict[str, Any] = {"changes": changes, "admin": admin}
        if tenant is not None:
            body["tenant"] = tenant
        job: dict[str, Any] = self.call("PATCH", f"/v1/jobs/{int(job_id)}", json=body)
        return job

    # -- cluster ------------------------------------------------------------------

    def ping(self) -> dict[str, Any]:
        answer: dict[str, Any] = self.call("GET", "/v1/ping")
        return answer

    def nodes(self) -> list[dict[str, Any]]:
        nodes: list[dict[str, Any]] = self.call("GET", "/v1/nodes")["nodes"]
        return nodes

    def drain_node(self, name: str, *, reason: str, by: str = "") -> dict[str, Any]:
        """scontrol update NodeName=x State=DRAIN Reason=...; the node as it is afterwards."""
        node: dict[str, Any] = self.call(
            "POST", f"/v1/nodes/{quote(name, safe='')}/drain", json={"reason": reason, "by": by}
        )
        return node

    def resume_node(self, name: str, *, by: str = "") -> dict[str, Any]:
        node: dict[str, Any] = self.call(
            "POST", f"/v1/nodes/{quote(name, safe='')}/resume", json={"by": by}
        )
        return node

    def partitions(self) -> list[dict[str, Any]]:
        parts: list[dict[str, Any]] = self.call("GET", "/v1/partitions")["partitions"]
        return parts

    def policy(self) -> dict[str, Any]:
        """Accounts (shares, decayed usage, fair-share factor), QoS and priority weights."""
        answer: dict[str, Any] = self.call("GET", "/v1/policy")
        return answer

    def raft(self) -> dict[str, Any]:
        """This replica's Raft view (role, term, leader, commit index, members)."""
        answer: dict[str, Any] = self.call("GET", "/v1/raft")["replica"]
        return answer

    # -- agents -------------------------------------------------------------------

    def register_node(self, node: dict[str, Any], *, proof: str = "") -> dict[str, Any]:
        """`{"heartbeat_interval_s", "credential"}`; `proof` shows a node that registers
        again holds its credential (scheduler/rpc/signatures.registration_proof)."""
        headers = {"X-Spur-Node-Proof": proof} if proof else {}
        answer: dict[str, Any] = self.call("POST", "/v1/nodes/register", json=node, headers=headers)
        return answer

    def heartbeat(
        self, node: str, running: list[dict[str, int]], *, timeout_s: float | None = None
    ) -> dict[str, Any]:
        """The leader's answer: `{"kill": [...], "registered": bool, "lease_s": float}`
        (a follower's 503 sends the call on to the next replica). `timeout_s` per
        replica: a paused replica must not hold a heartbeat past the node timeout."""
        extra: dict[str, Any] = {} if timeout_s is None else {"timeout": timeout_s}
        answer: dict[str, Any] = self.call(
            "POST", f"/v1/nodes/{node}/heartbeat", json={"running": running}, **extra
        )
        return answer

    def report(self, report: JobReport) -> None:
        self.call("POST", f"/v1/jobs/{int(report.job_id)}/{report.kind}", json=report.body())

    def report_all(self, reports: Iterable[JobReport]) -> list[RpcError | None]:
        """Several reports in one request, committed in order: for each, None (taken)
        or the error that refused that one alone."""
        body = {"reports": [report.to_dict() for report in reports]}
        results = self.call("POST", "/v1/reports", json=body)["results"]
        out: list[RpcError | None] = []
        for result in results:
            error = result.get("error")
            if error is None:
                out.append(None)
            else:
                out.append(error_for(int(error["status"]), str(error["detail"]), error["code"]))
        return out

    # -- job steps (scheduler/ctld/steps.py) ------------------------------------------------

    def create_step(self, job_id: int, step: dict[str, Any], *, tenant: str) -> dict[str, Any]:
        """A new step of a running job of `tenant`: `{"step_id", "launches": [{"node",
        "agent_url", "payload"}]}`, each payload signed for its node."""
        answer: dict[str, Any] = self.call(
            "POST", f"/v1/jobs/{int(job_id)}/steps/create", json={"tenant": tenant, "step": step}
        )
        return answer

    def end_step(
        self,
        job_id: int,
        step_id: int,
        *,
        tenant: str,
        exit_code: int,
        signal: int = 0,
        attempt: int | None = None,
    ) -> None:
        """`attempt`: the job attempt the step belongs to (a 409 when the job runs
        another by now)."""
        body: dict[str, Any] = {"tenant": tenant, "exit_code": exit_code, "signal": signal}
        if attempt is not None:
            body["attempt"] = attempt
        self.call("POST", f"/v1/jobs/{int(job_id)}/steps/{int(step_id)}/end", json=body)

    def cancel_step(
        self,
        job_id: int,
        step_id: int,
        *,
        tenant: str,
        signal: int | None = None,
        attempt: int | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"tenant": tenant}
        if signal is not None:
            body["signal"] = signal
        if attempt is not None:
            body["attempt"] = attempt
        job: dict[str, Any] = self.call(
            "POST", f"/v1/jobs/{int(job_id)}/steps/{int(step_id)}/cancel", json=body
        )
        return job

    # -- terminal tokens (scheduler/ctld/terminals.py) --------------------------------------

    def terminal_token(self, job_id: int, *, tenant: str, user: str) -> dict[str, Any]:
        """A short-lived token for a PTY in a running job of `tenant`: `{"token", "node",
        "agent_url", "expires"}`."""
        answer: dict[str, Any] = self.call(
            "POST", f"/v1/jobs/{int(job_id)}/terminal/token", json={"tenant": tenant, "user": user}
        )
        return answer

    def service_token(self, job_id: int, *, tenant: str, user: str) -> dict[str, Any]:
        """The same for the agent's proxy to the session's service (its JupyterLab)."""
        answer: dict[str, Any] = self.call(
            "POST", f"/v1/jobs/{int(job_id)}/service/token", json={"tenant": tenant, "user": user}
        )
        return answer


def _job_filters(
    tenant: str | None,
    states: Iterable[str] | None,
    ids: Iterable[int] | None,
    users: Iterable[str],
    names: Iterable[str],
    accounts: Iterable[str],
    partitions: Iterable[str],
    ended_after: float | None,
    fields: Iterable[str] | None,
) -> list[tuple[str, str]]:
    """The query of `GET /v1/jobs` for these filters."""
    params: list[tuple[str, str]] = []
    if tenant is not None:
        params.append(("tenant", tenant))
    if states:
        params.append(("states", ",".join(states)))
    if ids:
        params.append(("ids", ",".join(str(i) for i in ids)))
    for key, values in (
        ("user", users),
        ("name", names),
        ("account", accounts),
        ("partition", partitions),
    ):
        params.extend((key, value) for value in values)  # a name may hold a comma
    if ended_after is not None:
        params.append(("ended_after", repr(float(ended_after))))
    if fields:
        params.append(("fields", ",".join(fields)))
    return params


__all__ = ["ControllerClient", "JobReport"]
