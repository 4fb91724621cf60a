"""The controller's side of job steps (srun): create a step, sign its launch for each of
its nodes, record its end, cancel it (docs/architecture.md, "Job steps").

Two kinds of caller:

- `srun` inside a job, with the job's step credential (`Authorization: Bearer
  spur-step...`, scheduler/rpc/signatures.py `step_token`), never the cluster token:
  `POST /v1/jobs/{id}/steps` and `POST /v1/jobs/{id}/steps/{step}/finished`. The
  credential names one job attempt and is taken only while that attempt runs, for that
  job's steps; every request is bounded here, before anything is proposed to Raft.
- the web and the agents (cluster token): `POST /v1/jobs/{id}/steps/create` and
  `.../steps/{step}/end` (a step outside the job's sandbox), `.../steps/{step}/cancel`
  (scancel N.S; an agent's, for a step whose srun is gone for good).

A created step's answer holds one launch per node, each signed with that node's
credential over the whole step (command, environment, tasks, input, terminal) and
expiring in `STEP_TTL_S`, and the step's I/O credential for that node (`io`,
`signatures.step_io_token`): srun carries the launches to the agents, which run nothing
unsigned, and attaches again, writes its input, resizes or signals the tasks there with
the credential.
"""

from __future__ import annotations

import functools
import signal as signals
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from scheduler.core import commands as c
from scheduler.core.contract import MAX_SIGNAL, JobState
from scheduler.core.contract.steps import (
    MAX_PTY_SIZE,
    MAX_STEP_ARGS,
    MAX_STEP_ARGV_BYTES,
    MAX_STEP_ENV,
    MAX_STEP_ENV_BYTES,
    MAX_STEP_NAME,
    MAX_STEP_TASKS,
    STEP_INPUT_MODES,
)
from scheduler.ctld.controller import Controller, new_id
from scheduler.rpc import server as rpc
from scheduler.rpc import signatures
from scheduler.rpc.errors import Conflict, NotFound, Refused, Unauthorized
from scheduler.rpc.server import Call, JsonResponse, RpcRoute, as_rpc_error, error_response
from scheduler.slurm.jobenv import step_layout

MAX_STEP_BODY = 8 * 1024 * 1024
_STEP_FIELDS = {
    "name",
    "nodes",
    "ntasks",
    "ntasks_per_node",
    "cpus_per_task",
    "gpus_per_task",
    "argv",
    "env",
    "cwd",
    "input",
    "pty",
    "cpu_bind",
}


def _strings(value: Any, key: str, *, count: int, size: int) -> list[str]:
    if not isinstance(value, list) or len(value) > count:
        raise Refused(f"{key} must be a list of at most {count} strings")
    if not all(isinstance(v, str) and "\0" not in v for v in value):
        raise Refused(f"{key} must be a list of strings")
    if sum(len(v) for v in value) > size:
        raise Refused(f"{key} is larger than {size} bytes")
    return list(value)


def _environment(value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or len(value) > MAX_STEP_ENV:
        raise Refused(f"env must be an object of at most {MAX_STEP_ENV} strings")
    size = 0
    for key, item in value.items():
        if not isinstance(item, str) or not key or "=" in key or "\0" in key + item:
            raise Refused("env must map variable names to strings")
        size += len(key) + len(item)
    if size > MAX_STEP_ENV_BYTES:
        raise Refused(f"env is larger than {MAX_STEP_ENV_BYTES} bytes")
    return dict(value)


def plan_step(job: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """The step a request asks for, against its job: nodes, tasks, each task's GPUs.
    Refused with srun's words when the allocation cannot hold it."""
    rpc.only(body, _STEP_FIELDS)
    job_id = job["job_id"]
    job_nodes: list[str] = list(job["nodes"])
    allocation: dict[str, Any] = job["allocation"]
    spec = job.get("spec") or {}
    argv = _strings(body.get("argv"), "argv", count=MAX_STEP_ARGS, size=MAX_STEP_ARGV_BYTES)
    if not argv or not argv[0]:
        raise Refused("a step needs a command")
    env = _environment(body.get("env", {}))
    cwd = rpc.text(body, "cwd", max_length=4096) or str(job.get("workdir") or "/")
    name = rpc.text(body, "name", max_length=MAX_STEP_NAME) or argv[0].rsplit("/", 1)[-1]
    nodes_wanted = rpc.optional_integer(body, "nodes", low=1, high=MAX_STEP_TASKS)
    ntasks = rpc.optional_integer(body, "ntasks", low=1, high=MAX_STEP_TASKS)
    per_node = rpc.optional_integer(body, "ntasks_per_node", low=1, high=MAX_STEP_TASKS)
    cpus_per_task = rpc.integer(body, "cpus_per_task", low=1, high=100_000, default=1)
    gpus_per_task = rpc.integer(body, "gpus_per_task", low=0, high=1024, default=0)
    cpu_bind = rpc.text(body, "cpu_bind", default="none", max_length=16)
    if cpu_bind not in ("none", "cores"):
        raise Refused(f"Invalid --cpu-bind argument: {cpu_bind}")
    if nodes_wanted is not None and nodes_wanted > len(job_nodes):
        raise Refused(f"Only allocated {len(job_nodes)} nodes asked for {nodes_wanted}")
    if nodes_wanted is not None:
        count = nodes_wanted
    elif ntasks is not None:
        count = min(ntasks, len(job_nodes))
    else:
        count = len(job_nodes)
    if ntasks is None:
        if per_node is not None:
            ntasks = per_node * count
        elif nodes_wanted is not None:
            ntasks = count
        else:
            ntasks = max(int(spec.get("ntasks", 1)), count)
    if ntasks < count:
        count = ntasks  # Slurm: -N is lowered to -n when fewer tasks than nodes
    if ntasks > MAX_STEP_TASKS:
        raise Refused(f"at most {MAX_STEP_TASKS} tasks in a step")
    input_ = _input(body.get("input", "all"), ntasks)
    pty = _pty(body.get("pty"))
    nodes = job_nodes[:count]
    layout = step_layout(ntasks, nodes)
    tasks: dict[str, list[list[Any]]] = {}
    for node, ranks in zip(nodes, layout, strict=True):
        held = allocation.get(node) or {}
        cpus = int(held.get("cpus", 1))
        if len(ranks) * cpus_per_task > cpus:
            raise Refused(
                f"Unable to create step for job {job_id}: More processors requested than permitted"
            )
        node_gpus = [int(g) for g in held.get("gpus", ())]
        if gpus_per_task and len(ranks) * gpus_per_task > len(node_gpus):
            raise Refused(
                f"Unable to create step for job {job_id}: "
                "Requested node configuration is not available"
            )
        tasks[node] = [
            [
                rank,
                local,
                node_gpus[local * gpus_per_task : (local + 1) * gpus_per_task]
                if gpus_per_task
                else node_gpus,
            ]
            for local, rank in enumerate(ranks)
        ]
    return {
        "name": name,
        "argv": argv,
        "env": env,
        "cwd": cwd,
        "nodes": nodes,
        "ntasks": ntasks,
        "tasks_per_node": [len(r) for r in layout],
        "cpus_per_task": cpus_per_task,
        "gpus_per_task": gpus_per_task,
        "tasks": tasks,
        "input": input_,  # who reads srun's stdin: "all", "none" or a rank
        "pty": pty,  # task 0's terminal, [columns, rows] (srun --pty), or None
        "cpu_bind": cpu_bind,
    }


def _input(value: Any, ntasks: int) -> str | int:
    """srun's -i: "all" (Slurm's default), "none", or the rank of the one task that reads
    it. A rank the step does not have is a file name to Slurm, which srun cannot open."""
    if value in STEP_INPUT_MODES:
        return str(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        if value >= ntasks:
            raise Refused("Could not open stdin file: No such file or directory")
        return value
    raise Refused('input must be "all", "none" or a task rank')


def _pty(value: Any) -> list[int] | None:
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        or not all(0 <= v <= MAX_PTY_SIZE for v in value)
    ):
        raise Refused(f"pty must be [columns, rows], each 0 to {MAX_PTY_SIZE}")
    return [int(value[0]), int(value[1])]


def step_launches(
    controller: Controller, job: dict[str, Any], step_id: int, plan: dict[str, Any]
) -> list[dict[str, Any]]:
    """One signed launch per node of the step, with the step's I/O credential there."""
    expires = time.time() + signatures.STEP_TTL_S
    with controller.replica.lock:
        urls = {
            n: controller.replica.state.nodes[n].spec.agent_url
            for n in plan["nodes"]
            if n in controller.replica.state.nodes
        }
    launches = []
    for node in plan["nodes"]:
        step = {k: v for k, v in plan.items() if k != "tasks"}
        step["tasks"] = plan["tasks"][node]
        payload: dict[str, Any] = {
            "job_id": job["job_id"],
            "attempt": job["attempt"],
            "step_id": step_id,
            "node": node,
            "step": step,
            # Only the first node heard of the job at its launch: the others learn it here.
            "job": job,
            "cluster_name": controller.config.cluster_name,
        }
        credential = signatures.node_key(controller.signing_key, node)
        fields = signatures.step_launch_fields(payload)
        payload["signature"] = signatures.sign(credential, "step", fields, expires=expires)
        io = signatures.step_io_token(credential, node, job["job_id"], job["attempt"], step_id)
        launches.append(
            {"node": node, "agent_url": urls.get(node, ""), "payload": payload, "io": io}
        )
    return launches


def _job_for_token(controller: Controller, request: Request, job_id: int) -> dict[str, Any]:
    """The running job the request's step credential names; Unauthorized otherwise."""
    header = request.headers.get("authorization", "")
    if not header.startswith("Bearer "):
        raise Unauthorized("a step credential is required")
    token_job, attempt, node = signatures.check_step_token(
        controller.signing_key, header.removeprefix("Bearer ")
    )
    job = controller.job(job_id)
    if token_job != job_id or job is None:
        raise Unauthorized("this step credential is not this job's")
    if job["state"] != JobState.RUNNING.value or job["attempt"] != attempt:
        raise Unauthorized(f"job {job_id} is not running: its step credential has expired")
    if node not in job["nodes"]:
        raise Unauthorized("invalid step credential")
    return job


def _step_endpoint(
    controller: Controller, handler: Callable[[Call, dict[str, Any]], Awaitable[Any]]
) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            raw = str(request.path_params["job_id"])
            if not raw.isdigit() or len(raw) > 18:
                raise NotFound("Invalid job id specified")
            job = await _in_thread(_job_for_token, controller, request, int(raw))
            result = await handler(Call.of(request, MAX_STEP_BODY), job)
        except Exception as exc:
            error = as_rpc_error(exc)
            if error is None:
                raise
            return error_response(error)
        status, value = result if isinstance(result, tuple) else (200, result)
        return JsonResponse(value, status_code=status)

    return endpoint


def job_routes(controller: Controller) -> list[Route]:
    """The routes `srun` calls with the job's step credential (not the cluster token)."""

    async def create(call: Call, job: dict[str, Any]) -> Any:
        return 201, await create_step(controller, job, await call.body())

    async def finished(call: Call, job: dict[str, Any]) -> Any:
        return await finish_step(controller, job, _step_id(call), await call.body())

    return [
        Route("/v1/jobs/{job_id}/steps", _step_endpoint(controller, create), methods=["POST"]),
        Route(
            "/v1/jobs/{job_id}/steps/{step_id}/finished",
            _step_endpoint(controller, finished),
            methods=["POST"],
        ),
    ]


async def create_step(
    controller: Controller, job: dict[str, Any], body: dict[str, Any]
) -> dict[str, Any]:
    """Plan the step against its job, record it, and sign its launches."""
    from scheduler.ctld.api import _commit

    plan = plan_step(job, body)
    cmd_id = new_id()
    command = c.CreateStep(
        cmd_id,
        time.time(),
        job["job_id"],
        job["attempt"],
        plan["name"],
        tuple(plan["nodes"]),
        plan["ntasks"],
    )
    await _commit(controller.replica.commit_async(command))
    created: dict[str, Any] = await _in_thread(_created, controller, job, cmd_id, plan)
    return created


def _created(
    controller: Controller, job: dict[str, Any], cmd_id: str, plan: dict[str, Any]
) -> dict[str, Any]:
    """The step `cmd_id` created, with its launches (reads the state: a thread's)."""
    with controller.replica.lock:
        steps = controller.replica.state.jobs[job["job_id"]].steps
        step_id = next(s.step_id for s in steps if s.cmd_id == cmd_id)
    return {"step_id": step_id, "launches": step_launches(controller, job, step_id, plan)}


async def finish_step(
    controller: Controller, job: dict[str, Any], step_id: int, body: dict[str, Any]
) -> dict[str, Any]:
    from scheduler.ctld.api import _commit

    rpc.only(body, {"exit_code", "signal", "tenant", "attempt"})
    _same_attempt(job, body)
    command = c.StepFinished(
        new_id(),
        time.time(),
        job["job_id"],
        job["attempt"],
        step_id,
        rpc.integer(body, "exit_code", low=0, high=255),
        rpc.integer(body, "signal", low=0, high=MAX_SIGNAL, default=0),
    )
    await _commit(controller.replica.commit_async(command))
    return {"ok": True}


def _same_attempt(job: dict[str, Any], body: dict[str, Any]) -> None:
    """A report names the attempt it is about (an agent's, about a step that ran
    unwatched, may come after a requeue): another attempt's step is not this one's."""
    attempt = rpc.optional_integer(body, "attempt", low=0, high=1 << 31)
    if attempt is not None and attempt != job["attempt"]:
        raise Conflict(
            f"job {job['job_id']} runs attempt {job['attempt']}, not {attempt}", code="not_running"
        )


async def _in_thread(func: Callable[..., Any], *args: Any) -> Any:
    from scheduler.ctld.api import _in_thread as in_thread

    return await in_thread(func, *args)


def _step_id(call: Call) -> int:
    raw = str(call.path["step_id"])
    if not raw.isdigit() or len(raw) > 9:
        raise NotFound(f"Invalid step id {raw!r}")
    return int(raw)


def cluster_routes(controller: Controller) -> list[RpcRoute]:
    """The web's (cluster token): scancel N.S."""
    from scheduler.ctld.api import _commit

    async def tenant_job(call: Call, body: dict[str, Any]) -> dict[str, Any]:
        tenant = body.get("tenant")
        job: dict[str, Any] | None = await _in_thread(
            functools.partial(
                controller.job, call.path["job_id"], tenant=None if tenant is None else str(tenant)
            )
        )
        if job is None:
            raise NotFound("Invalid job id specified")
        return job

    async def create(call: Call) -> Any:
        """The web's, for a job's owner outside its sandbox (salloc, srun outside an
        allocation): `{"tenant", "step": {...}}`."""
        body = await call.body()
        rpc.only(body, {"tenant", "step"})
        job = await tenant_job(call, body)
        if job["state"] != JobState.RUNNING.value:
            raise Conflict(f"Job {job['job_id']} is not running", code="not_running")
        step = body.get("step")
        if not isinstance(step, dict):
            raise Refused("step must be an object")
        return 201, await create_step(controller, job, step)

    async def end(call: Call) -> Any:
        body = await call.body()
        job = await tenant_job(call, body)
        return await finish_step(controller, job, _step_id(call), body)

    async def cancel(call: Call) -> Any:
        job_id = call.path["job_id"]
        body = await call.body()
        rpc.only(body, {"tenant", "signal", "attempt"})
        job = await tenant_job(call, body)
        _same_attempt(job, body)
        step_id = _step_id(call)
        if step_id >= len(job.get("steps") or ()):
            raise NotFound(f"Invalid job id specified: {job_id}.{step_id}")
        if job["state"] != JobState.RUNNING.value:
            raise Conflict(f"Job {job_id} is not running", code="not_running")
        signum = rpc.integer(body, "signal", low=1, high=MAX_SIGNAL, default=int(signals.SIGKILL))
        await _commit(
            controller.replica.commit_async(
                c.CancelStep(new_id(), time.time(), job_id, step_id, signum)
            )
        )
        return await _in_thread(controller.job, job_id)

    return [
        RpcRoute("/v1/jobs/{job_id:int}/steps/create", create, ("POST",)),
        RpcRoute("/v1/jobs/{job_id:int}/steps/{step_id}/end", end, ("POST",)),
        RpcRoute("/v1/jobs/{job_id:int}/steps/{step_id}/cancel", cancel, ("POST",)),
    ]
