"""The controller's HTTP RPC API (docs/architecture.md, "Controller API"), on the RPC kit
(`scheduler.rpc.server`): every route behind the cluster token, bodies bounded, and
refusals answered with their status.

The event loop never takes the replica's lock (`StateLock` refuses it): the Raft thread
holds it to apply each entry and the scheduling pass to plan, and a loop waiting for it
stalls every request, heartbeat and report. So commits are awaited (`_commit`: the group
commit resolves an asyncio future, no thread waits), a submission's answer is the job's
view that the apply built, and every read of the state runs in the thread pool
(`_in_thread`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from scheduler.client import MAX_REPORT_BATCH, MAX_SUBMIT_BATCH, JobReport
from scheduler.core.commands import MAX_NODE_REASON, ActionRequest
from scheduler.core.contract import MAX_SIGNAL, MIN_SIGNAL, JobAction, JobSpec, select_fields
from scheduler.core.contract.job_object import COLUMN_SHAPES, SHAPES
from scheduler.core.contract.update import parse_update
from scheduler.core.errors import InvalidSpec, Rejected
from scheduler.core.resources import NodeSpec
from scheduler.ctld import metrics, terminals
from scheduler.ctld import steps as step_api
from scheduler.ctld.controller import Controller
from scheduler.ctld.replica import MembershipError, ReplicaUnavailable
from scheduler.rpc import server as rpc
from scheduler.rpc.errors import Conflict, NotFound, Refused, Unavailable
from scheduler.rpc.server import Call, Handler, RpcRoute

log = logging.getLogger(__name__)

# A registering agent proves it holds its node's credential (scheduler/rpc/signatures.py).
PROOF_HEADER = "x-spur-node-proof"
# A job action's path segment, from the contract: /v1/jobs/{id}/{action}.
ACTION_PATH = "/v1/jobs/{job_id:int}/{action:str}"


def _epoch(text: str | None) -> float | None:
    """A query's time in epoch seconds, or None; Refused (400) if it is not one."""
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < 1e11:  # NaN is neither
        raise Refused(f"not a time in epoch seconds: {text[:40]!r}")
    return value


def build_app(controller: Controller, token: str) -> Starlette:
    def found(job: dict[str, Any] | None) -> dict[str, Any]:
        if job is None:
            raise NotFound("Invalid job id specified")
        return job

    async def ping(call: Call) -> Any:
        replica = controller.replica
        http = dict(controller.config.controller.raft_http)
        leader = replica.leader_address
        return {
            "ok": True,
            "leader": replica.is_leader,
            "leader_address": leader,
            "leader_url": http.get(leader, ""),
            "self": replica.self_address,
            "ready": replica.is_ready,
            "commit_index": replica.status().get("commit_idx", 0),
        }

    async def submit(call: Call) -> Any:
        body = await call.body()
        rpc.only(body, {"spec", "idempotency_key"})
        spec = JobSpec.from_dict(body.get("spec"))
        key = rpc.text(body, "idempotency_key", max_length=200)
        submitted = await _commit(controller.submit(spec, idempotency_key=key))
        return 201, {"job_id": submitted.job_id, "job": submitted.job}

    async def submit_batch(call: Call) -> Any:
        """`{"jobs": [{"spec", "idempotency_key"?}]}`: every spec checked before any is
        committed (one invalid refuses them all, 400 naming it); then committed together.
        Each result is `{"job_id", "job"}` or, for one the state refused, `{"error":
        {"detail", "code", "status"}}`."""
        body = await call.body()
        rpc.only(body, {"jobs"})
        items = body.get("jobs")
        if not isinstance(items, list) or not 1 <= len(items) <= MAX_SUBMIT_BATCH:
            raise Refused(f"jobs must be a list of 1 to {MAX_SUBMIT_BATCH} submissions")
        specs: list[tuple[JobSpec, str]] = []
        for index, item in enumerate(items):
            if not isinstance(item, dict):
                raise Refused(f"jobs[{index}] must be an object")
            rpc.only(item, {"spec", "idempotency_key"})
            try:
                spec = JobSpec.from_dict(item.get("spec"))
            except InvalidSpec as exc:
                where = f"jobs[{index}]: " if len(items) > 1 else ""
                raise Refused(f"{where}{exc.message}", code="invalid") from None
            specs.append((spec, rpc.text(item, "idempotency_key", max_length=200)))
        results = await _commit(controller.submit_all(specs))
        out: list[dict[str, Any]] = []
        for result in results:
            if isinstance(result, Rejected):
                out.append(_error(result))
            else:
                out.append({"job_id": result.job_id, "job": result.job})
        return 201, {"results": out}

    async def list_jobs(call: Call) -> Any:
        """`{"jobs": [job dict]}`, or with `shape=columns` or `runs` (and `fields`) the
        columns answer (`Controller.job_columns`), which the web passes on as it is."""
        q = call.query
        states = set(q["states"].split(",")) if q.get("states") else None
        fields = select_fields(q["fields"].split(",")) if q.get("fields") else None
        shape = q.get("shape", "rows")
        if shape not in SHAPES or (shape in COLUMN_SHAPES and fields is None):
            raise Refused(f"shape is one of {', '.join(SHAPES)}; columns need fields")
        filters: dict[str, Any] = {
            "tenant": q.get("tenant"),
            "states": states,
            "ids": rpc.id_list(q.get("ids")),
            "users": q.getlist("user"),
            "names": q.getlist("name"),
            "accounts": q.getlist("account"),
            "partitions": q.getlist("partition"),
            "ended_after": _epoch(q.get("ended_after")),
        }
        if shape in COLUMN_SHAPES:
            assert fields is not None
            return await _in_thread(
                controller.job_columns, fields=fields, runs=shape == "runs", **filters
            )
        return {"jobs": await _in_thread(controller.jobs, fields=fields, **filters)}

    async def get_job(call: Call) -> Any:
        return found(
            await _in_thread(controller.job, call.path["job_id"], tenant=call.query.get("tenant"))
        )

    async def tenant_job(job_id: int, tenant: Any) -> dict[str, Any]:
        return found(
            await _in_thread(controller.job, job_id, tenant=None if tenant is None else str(tenant))
        )

    async def act(call: Call) -> Any:
        job_id = call.path["job_id"]
        try:
            action = JobAction(call.path["action"])
        except ValueError:
            raise NotFound(f"unknown job action {call.path['action']!r}") from None
        body = await call.body()
        rpc.only(body, {"tenant", "signal", "admin", "by"})
        await tenant_job(job_id, body.get("tenant"))
        request = ActionRequest(
            action,
            job_id,
            signal=rpc.optional_integer(body, "signal", low=MIN_SIGNAL, high=MAX_SIGNAL),
            admin=rpc.boolean(body, "admin"),
            by=rpc.text(body, "by", max_length=150),
        )
        await _commit(controller.act(request))
        return found(await _in_thread(controller.job, job_id))

    async def update(call: Call) -> Any:
        """scontrol update: `{"changes": {field: value}, "tenant", "admin"}`, the changes
        checked as the spec checks them (`contract.update.parse_update`) before the log."""
        job_id = call.path["job_id"]
        body = await call.body()
        rpc.only(body, {"changes", "tenant", "admin"})
        await tenant_job(job_id, body.get("tenant"))
        changes = parse_update(body.get("changes"))  # InvalidSpec: 400, with the field
        await _commit(controller.update(job_id, changes, admin=rpc.boolean(body, "admin")))
        return found(await _in_thread(controller.job, job_id))

    async def nodes(call: Call) -> Any:
        return {"nodes": await _in_thread(controller.nodes)}

    async def drain_node(call: Call) -> Any:
        body = await call.body()
        rpc.only(body, {"reason", "by"})
        reason = rpc.text(body, "reason", max_length=MAX_NODE_REASON)
        by = rpc.text(body, "by", max_length=150)
        await _commit(controller.drain_node(call.path["node"], reason=reason, by=by))
        return await _in_thread(controller.node, call.path["node"])

    async def resume_node(call: Call) -> Any:
        body = await call.body()
        rpc.only(body, {"by"})
        by = rpc.text(body, "by", max_length=150)
        await _commit(controller.resume_node(call.path["node"], by=by))
        return await _in_thread(controller.node, call.path["node"])

    async def partitions(call: Call) -> Any:
        return {"partitions": await _in_thread(controller.partitions)}

    async def policy(call: Call) -> Any:
        return await _in_thread(controller.policy)

    async def register(call: Call) -> Any:
        node = NodeSpec.from_dict(await call.body())
        proof = call.headers.get(PROOF_HEADER, "")[:200]
        credential = await _in_thread(controller.credential_for, node.name, proof)
        await _in_thread(controller.register, node)
        return {
            "heartbeat_interval_s": controller.config.controller.heartbeat_interval_s,
            "lease_s": controller.config.controller.lease_s,
            "credential": credential,
        }

    async def heartbeat(call: Call) -> Any:
        body = await call.body()
        running = body.get("running", [])
        if not isinstance(running, list) or len(running) > 100_000:
            raise Refused("running must be a list of at most 100,000 jobs")
        pairs = [
            (rpc.integer(r, "job_id", low=0), rpc.integer(r, "attempt", low=0))
            for r in running
            if isinstance(r, dict)
        ]
        return await _in_thread(controller.heartbeat, call.path["node"], pairs)

    async def raft(call: Call) -> Any:
        """This replica's Raft view: role, term, commit index, log positions, members."""
        return {"replica": controller.replica.raft_info()}

    async def add_member(call: Call) -> Any:
        body = await call.body()
        rpc.only(body, {"address"})
        address = _raft_address(body)
        await _in_thread(controller.replica.add_member, address)
        return {"members": controller.replica.raft_info()["members"]}

    async def remove_member(call: Call) -> Any:
        address = _raft_address({"address": call.path["address"]})
        await _in_thread(controller.replica.remove_member, address)
        return {"members": controller.replica.raft_info()["members"]}

    def reporting(kind: Literal["started", "finished"]) -> Handler:
        async def report(call: Call) -> Any:
            body = await call.body()
            await _commit(controller.report(_report(kind, call.path["job_id"], body)))
            return {"ok": True}

        return report

    async def reports(call: Call) -> Any:
        """`{"reports": [{"kind", "job_id", ...the report's fields}]}`, an agent's queued
        reports (`JobReport.to_dict`), committed together in order. Each is answered on
        its own, `{"ok": true}` or `{"error": {"detail", "code", "status"}}`: one that is
        malformed or that the state refused changes nothing and refuses none of the
        others."""
        body = await call.body()
        rpc.only(body, {"reports"})
        items = body.get("reports")
        if not isinstance(items, list) or not 1 <= len(items) <= MAX_REPORT_BATCH:
            raise Refused(f"reports must be a list of 1 to {MAX_REPORT_BATCH} reports")
        out: list[dict[str, Any] | None] = []
        valid: list[JobReport] = []
        for index, item in enumerate(items):
            try:
                valid.append(_batched_report(item))
                out.append(None)
            except Refused as exc:
                out.append(_error(Refused(f"reports[{index}]: {exc.message}")))
        results = iter(await _commit(controller.report_all(valid)) if valid else [])
        for index, slot in enumerate(out):
            if slot is None:
                refused = next(results)
                out[index] = {"ok": True} if refused is None else _error(refused)
        return {"results": out}

    app = rpc.rpc_app(
        [
            RpcRoute("/v1/ping", ping),
            RpcRoute("/v1/jobs", submit, ("POST",)),
            RpcRoute("/v1/jobs/batch", submit_batch, ("POST",)),
            RpcRoute("/v1/jobs", list_jobs),
            RpcRoute("/v1/jobs/{job_id:int}", get_job),
            RpcRoute("/v1/jobs/{job_id:int}", update, ("PATCH",)),
            RpcRoute("/v1/jobs/{job_id:int}/started", reporting("started"), ("POST",)),
            RpcRoute("/v1/jobs/{job_id:int}/finished", reporting("finished"), ("POST",)),
            RpcRoute("/v1/reports", reports, ("POST",)),
            # After the two above, whose paths it would match too.
            RpcRoute(ACTION_PATH, act, ("POST",)),
            RpcRoute("/v1/nodes", nodes),
            RpcRoute("/v1/nodes/register", register, ("POST",)),
            RpcRoute("/v1/nodes/{node}/heartbeat", heartbeat, ("POST",)),
            RpcRoute("/v1/nodes/{node}/drain", drain_node, ("POST",)),
            RpcRoute("/v1/nodes/{node}/resume", resume_node, ("POST",)),
            RpcRoute("/v1/partitions", partitions),
            RpcRoute("/v1/policy", policy),
            RpcRoute("/v1/raft", raft),
            RpcRoute("/v1/raft/members", add_member, ("POST",)),
            RpcRoute("/v1/raft/members/{address:str}", remove_member, ("DELETE",)),
            *step_api.cluster_routes(controller),
            *terminals.routes(controller),
        ],
        token=token,
    )
    # Without the cluster token: counts only, no tenant data (scheduler/ctld/metrics.py).
    registry = metrics.registry_for(controller)

    async def scrape(request: Request) -> Response:
        body, content_type = await run_in_threadpool(metrics.render, registry)
        return Response(body, media_type=content_type)

    app.router.routes.append(Route("/metrics", scrape, methods=["GET"]))
    # srun's, with a job's step credential instead of the cluster token: first, before
    # the job action route, which would take /v1/jobs/{id}/steps too.
    app.router.routes[0:0] = step_api.job_routes(controller)
    return app


def _raft_address(body: dict[str, Any]) -> str:
    """A replica's Raft address, HOST:PORT."""
    address = rpc.text(body, "address", max_length=255)
    host, _, port = address.rpartition(":")
    if (
        not host
        or not port.isdigit()
        or not 0 < int(port) < 65536
        or any(c.isspace() for c in host)
    ):
        raise Refused(f"address must be HOST:PORT, not {address!r}")
    return address


def _report(kind: Literal["started", "finished"], job_id: int, body: dict[str, Any]) -> JobReport:
    """The report an agent sent, checked field by field."""
    attempt = rpc.integer(body, "attempt", low=0)
    node = rpc.text(body, "node", max_length=255)
    if kind == "started":
        rpc.only(body, {"attempt", "node", "pid", "limits"})
        return JobReport(
            kind,
            job_id,
            attempt,
            node,
            pid=rpc.integer(body, "pid", low=0),
            limits=rpc.text(body, "limits", max_length=32),
        )
    rpc.only(body, {"attempt", "node", "exit_code", "signal", "reason", "oom"})
    return JobReport(
        kind,
        job_id,
        attempt,
        node,
        exit_code=rpc.integer(body, "exit_code", low=-(2**31), high=2**31 - 1),
        signal=rpc.integer(body, "signal", low=0, high=MAX_SIGNAL, default=0),
        reason=rpc.text(body, "reason", max_length=200),
        oom=rpc.boolean(body, "oom"),
    )


def _batched_report(item: Any) -> JobReport:
    """One report of a batch, checked as its own route checks it."""
    if not isinstance(item, dict):
        raise Refused("a report must be an object")
    fields = dict(item)
    kind = fields.pop("kind", None)
    if kind not in ("started", "finished"):
        raise Refused("kind must be started or finished")
    job_id = rpc.integer(fields, "job_id", low=0)
    del fields["job_id"]
    return _report(kind, job_id, fields)


def _error(exc: Exception) -> dict[str, Any]:
    """One item's refusal, in a batch's answer."""
    error = rpc.as_rpc_error(exc)
    assert error is not None  # a Rejected or an RpcError always maps
    return {"error": {**error.body(), "status": error.status}}


T = TypeVar("T")


async def _commit(pending: Awaitable[T]) -> T:
    """A commit awaited on the event loop, its replica's failures as the API's."""
    try:
        return await pending
    except ReplicaUnavailable as exc:
        raise Unavailable(str(exc)) from exc


async def _in_thread(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    # Reads take the replica's lock, and some calls block until a commit is applied
    # (heartbeats, registrations): both stay off the event loop.
    try:
        return await run_in_threadpool(func, *args, **kwargs)
    except ReplicaUnavailable as exc:
        raise Unavailable(str(exc)) from exc
    except MembershipError as exc:
        raise Conflict(str(exc)) from exc
