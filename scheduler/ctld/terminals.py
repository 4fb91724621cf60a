"""The web's request for a terminal token (scheduler/rpc/terminal_tokens.py).

`POST /v1/jobs/{id}/terminal/token` with the cluster token and `{"tenant", "user"}`: for
a running job of that tenant, a token for its first node (where its batch script, and so
an interactive session's PTY, runs), signed with that node's credential, with the node's
agent URL. The web decides who may ask (the job's organisation, a member who runs jobs);
the controller decides for which job and node; the agent checks the token against the job
it runs.

`POST /v1/jobs/{id}/service/token`, the same with a token of the kind `spur-svc`: for the
agent's proxy to the session's HTTP service (agents/service_proxy.py)."""

from __future__ import annotations

import time
from typing import Any

from scheduler.core.contract import JobState
from scheduler.ctld.controller import Controller
from scheduler.rpc import server as rpc
from scheduler.rpc import signatures, terminal_tokens
from scheduler.rpc.errors import Conflict, NotFound, Refused
from scheduler.rpc.server import Call, RpcRoute

PATH = "/v1/jobs/{job_id:int}/terminal/token"
SERVICE_PATH = "/v1/jobs/{job_id:int}/service/token"


def routes(controller: Controller) -> list[RpcRoute]:
    async def terminal(call: Call) -> Any:
        return await token(call, terminal_tokens.PREFIX)

    async def service(call: Call) -> Any:
        return await token(call, terminal_tokens.SERVICE)

    async def token(call: Call, kind: str) -> Any:
        body = await call.body()
        rpc.only(body, {"tenant", "user"})
        tenant, user = body.get("tenant"), body.get("user")
        if not isinstance(tenant, str) or not tenant or not isinstance(user, str) or not user:
            raise Refused("tenant and user are required")
        job, agent_url = await _in_thread(_running_job, controller, call.path["job_id"], tenant)
        node = str(job["nodes"][0])
        now = time.time()
        return {
            "token": terminal_tokens.mint(
                signatures.node_key(controller.signing_key, node),
                job_id=int(job["job_id"]),
                attempt=int(job["attempt"]),
                node=node,
                tenant=tenant,
                user=user,
                now=now,
                kind=kind,
            ),
            "node": node,
            "agent_url": agent_url,
            "expires": int(now + terminal_tokens.TTL_S),
        }

    return [RpcRoute(PATH, terminal, ("POST",)), RpcRoute(SERVICE_PATH, service, ("POST",))]


def _running_job(controller: Controller, job_id: int, tenant: str) -> tuple[dict[str, Any], str]:
    """The tenant's running job and its first node's agent URL (reads the state: run in
    the thread pool)."""
    job = controller.job(job_id, tenant=tenant)
    if job is None:
        raise NotFound("Invalid job id specified")
    if job["state"] != JobState.RUNNING.value or not job.get("nodes"):
        raise Conflict(f"Job {job['job_id']} is not running", code="not_running")
    with controller.replica.lock:
        held = controller.replica.state.nodes.get(str(job["nodes"][0]))
        agent_url = held.spec.agent_url if held is not None else ""
    return job, agent_url


async def _in_thread(func: Any, *args: Any) -> Any:
    from scheduler.ctld.api import _in_thread as in_thread

    return await in_thread(func, *args)


__all__ = ["PATH", "SERVICE_PATH", "routes"]
