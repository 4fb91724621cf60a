"""Job steps on this node: the tasks `srun` starts, each contained as its job is.

A step launch comes from `srun` inside the job (never with the cluster token), signed
by the controller for this node over the whole step (scheduler/rpc/signatures.py,
`step_launch_fields`), and expiring within minutes. It names a job attempt this agent
launched (its batch step on the first node, or its share of the allocation on the
others): the tasks run as that job's identity, in its organisation's workspace, with
its GPUs' device nodes only, bound to its CPUs and in its cgroup, each in a sandbox of
its own (agents/sandbox.py) under its own supervisor (agents/supervisor.py: the
node's fencing lease kills them as it kills the batch script).

The answer is a stream of JSON lines, one per event, until every task has ended:

    {"t": rank, "o": base64}    a piece of the task's stdout
    {"t": rank, "e": base64}    a piece of its stderr
    {"t": rank, "x": exit_code, "s": signal}   the task ended
    {"error": "..."}            a task could not be started (the others are killed)

A client that goes away takes the step's tasks with it; so does the end of the job
(its batch script's end on the first node, a cancel or the heartbeat's kill list).
Each `(job, attempt, step)` launches once: a replayed launch is refused.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import selectors
import signal as signals
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.jobprocess import decode_status
from agents.jobtask import JobTask, data_fd, start_task, task_devices
from agents.launch_request import InvalidLaunch, LaunchRequest
from agents.limits import JobLimits
from agents.sandbox import DeviceNode
from scheduler.slurm.jobenv import step_environment

if TYPE_CHECKING:
    from agents.identity import Identity
    from agents.launcher import Launcher
    from agents.workspace import JobFiles

log = logging.getLogger(__name__)

SRUN_PATH = "/run/spur/bin/srun"
TOOLS_DIR = "/run/spur/bin"
_CHUNK = 65536


class StepRefused(Exception):
    """A step this node will not run (the API answers 409)."""


def srun_client() -> bytes:
    """The step client as the sandbox holds it at SRUN_PATH: scheduler/cli/srun.py, which
    needs nothing but Python's standard library (no platform package is in a sandbox)."""
    from scheduler.cli import srun

    source = Path(srun.__file__).read_bytes()
    if source.startswith(b"#!"):
        source = source.split(b"\n", 1)[1]
    return b"#!/usr/bin/env python3\n" + source


@dataclass
class StepRun:
    job_id: int
    attempt: int
    step_id: int
    tasks: list[JobTask] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.job_id, self.attempt, self.step_id)

    def signal(self, signum: int) -> bool:
        sent = False
        for task in self.tasks:
            if task.status is None and task.process.signal(signum):
                sent = True
        return sent


class StepRunner:
    def __init__(self, launcher: Launcher) -> None:
        self.launcher = launcher
        self._lock = threading.Lock()
        self._runs: dict[tuple[int, int, int], StepRun] = {}
        self._seen: set[tuple[int, int, int]] = set()
        self._shells = 0  # the last step id given to a shell (start_shell), counting down
        self._dir = Path(launcher.spool_dir) / "steps"

    # -- the API's operations ------------------------------------------------------

    def start(self, payload: Mapping[str, Any]) -> StepRun:
        """Start the step's tasks on this node (the signature was checked by the caller)."""
        job_id, attempt, step_id = (_int(payload, k) for k in ("job_id", "attempt", "step_id"))
        step = payload.get("step")
        if not isinstance(step, dict):
            raise InvalidLaunch("step must be an object")
        request = self.launcher.job_request(job_id, attempt)
        if request is None:
            # A node the batch script does not run on has not heard of the job: the signed
            # launch carries it. The batch node must still run it.
            request = LaunchRequest.from_payload(
                {
                    "job_id": job_id,
                    "attempt": attempt,
                    "node": self.launcher.node,
                    "cluster_name": payload.get("cluster_name", ""),
                    "job": payload.get("job"),
                }
            )
            if request.first_node == self.launcher.node:
                raise StepRefused(f"job {job_id} (attempt {attempt}) does not run on this node")
        key = (job_id, attempt, step_id)
        run = StepRun(job_id, attempt, step_id)
        with self._lock:
            if key in self._seen:
                raise StepRefused(f"step {job_id}.{step_id} was launched here already")
            self._seen.add(key)
            self._runs[key] = run
        try:
            identity, files, allocation, limits = self._placed(request)
            tasks = step.get("tasks")
            if not isinstance(tasks, list) or not tasks:
                raise InvalidLaunch("step.tasks must be a non-empty list")
            for entry in tasks:
                rank, local, gpus = _task_entry(entry)
                run.tasks.append(
                    self._spawn(request, step, run, identity, files, limits, rank, local, gpus,
                                ranks=[int(t[0]) for t in tasks])
                )  # fmt: skip
        except BaseException:
            run.signal(signals.SIGKILL)
            self._reap(run)
            raise
        log.info(
            "step %s.%s (attempt %s): %d task(s) started", job_id, step_id, attempt, len(run.tasks)
        )
        return run

    def start_shell(
        self,
        job_id: int,
        attempt: int,
        *,
        argv: list[str],
        env: Mapping[str, str],
        tty: int | None = None,
        stdio: tuple[int, int, int] | None = None,
    ) -> StepRun:
        """A process the agent itself starts in a job running here (the web terminal's
        shell, agents/terminal.py; an SSH session's, agents/ssh.py): one task with the
        job's environment (so srun works in it) on the terminal `tty` (or the descriptors
        `stdio`: stdin, stdout, stderr), contained as a step's task is and ended with the
        job as steps are. Its step id is negative: `scancel N.S` never names it."""
        if (tty is None) == (stdio is None):
            raise ValueError("a shell has a terminal or its own stdio, one of them")
        request = self.launcher.job_request(job_id, attempt)
        if request is None or request.first_node != self.launcher.node:
            raise StepRefused(f"job {job_id} (attempt {attempt}) does not run on this node")
        with self._lock:
            self._shells -= 1
            run = StepRun(job_id, attempt, self._shells)
            self._runs[run.key] = run
        try:
            identity, files, allocation, limits = self._placed(request)
            devices = self._devices([int(g) for g in allocation.get("gpus", ())])
            # The job's directory, once its first shell has made it (the path is the same
            # inside the sandbox, where the shell enters it as the job's identity).
            cwd = files.run_dir if os.path.isdir(files.run_dir) else files.workspace
            full = self.launcher.environment(
                request, identity, files, constrained=bool(devices), base=request.spec.env
            )
            full.update(env)
            run.tasks.append(
                self._sandboxed(
                    run, identity, files, limits, devices, [cwd, *argv], full,
                    rank=0, local=0, cpus=limits.cpus, tty=tty, stdio=stdio,
                )
            )  # fmt: skip
        except BaseException:
            self.end(run)
            raise
        return run

    def _placed(
        self, request: LaunchRequest
    ) -> tuple[Identity, JobFiles, Mapping[str, Any], JobLimits]:
        """Where a task of the job runs here: its identity and files, this node's share of
        its allocation, and the limits that share sets."""
        identity, files = self.launcher.place(request)
        allocation: Mapping[str, Any] = (request.job.get("allocation") or {}).get(
            self.launcher.node
        ) or {}
        limits = JobLimits.of(
            allocation, pids_max=self.launcher.pids_max, usable_cpus=self.launcher.usable_cpus
        )
        return identity, files, allocation, limits

    def wait_shell(self, run: StepRun) -> tuple[int, int]:
        """(exit code, signal) of a shell's task once it has ended (blocks until then)."""
        return self._wait_task(run.tasks[0])

    def end(self, run: StepRun) -> None:
        """Kill what is left of the run and wait for it (blocks until it is gone)."""
        run.signal(signals.SIGKILL)
        self._reap(run)

    def stream(self, run: StepRun) -> Iterator[bytes]:
        """The step's output and ends, as JSON lines, until every task has ended."""
        selector = selectors.DefaultSelector()
        open_fds = 0
        for task in run.tasks:
            for stream, pipe in (("o", task.monitor.stdout), ("e", task.monitor.stderr)):
                if pipe is not None:
                    os.set_blocking(pipe.fileno(), False)
                    selector.register(pipe.fileno(), selectors.EVENT_READ, (task, stream))
                    open_fds += 1
        try:
            while open_fds:
                for task in run.tasks:
                    if task.status is None and task.monitor.poll() is not None:
                        # Like the batch step: what the task left running dies with it
                        # (and lets go of its output).
                        self._wait_task(task)
                        task.process.kill(delivered=False)
                for key, _ in selector.select(timeout=0.2):
                    task, stream = key.data
                    try:
                        chunk = os.read(key.fd, _CHUNK)
                    except BlockingIOError:
                        continue
                    if chunk:
                        data = base64.b64encode(chunk).decode()
                        yield _line({"t": task.rank, stream: data})
                    else:
                        selector.unregister(key.fd)
                        open_fds -= 1
            for task in run.tasks:
                exit_code, signum = self._wait_task(task)
                yield _line({"t": task.rank, "x": exit_code, "s": signum})
        finally:
            selector.close()
            # The client went away, or the tasks ended: nothing of the step outlives it.
            run.signal(signals.SIGKILL)
            self._reap(run)

    def signal(self, job_id: int, attempt: int, signum: int, step_id: int | None = None) -> bool:
        """Signal the job's steps on this node (one step with `step_id`)."""
        with self._lock:
            runs = [
                r
                for r in self._runs.values()
                if (r.job_id, r.attempt) == (job_id, attempt)
                and (step_id is None or r.step_id == step_id)
            ]
        return any([r.signal(signum) for r in runs])

    def lease_dirs(self) -> list[Path]:
        """The supervisors of running tasks, whose fencing lease the agent renews with its
        jobs' (agents/supervisor.py)."""
        with self._lock:
            runs = list(self._runs.values())
        return [t.taskdir for r in runs for t in r.tasks if t.status is None]

    def running(self) -> list[tuple[int, int]]:
        with self._lock:
            return sorted({(r.job_id, r.attempt) for r in self._runs.values()})

    # -- one task ---------------------------------------------------------------------

    def _spawn(
        self,
        request: Any,
        step: Mapping[str, Any],
        run: StepRun,
        identity: Any,
        files: Any,
        limits: JobLimits,
        rank: int,
        local: int,
        gpus: list[int],
        *,
        ranks: list[int],
    ) -> JobTask:
        launcher = self.launcher
        argv = _strings(step.get("argv"), "step.argv")
        cwd = step.get("cwd")
        if not argv or not isinstance(cwd, str):
            raise InvalidLaunch("a step needs argv and cwd")
        nodes = _strings(step.get("nodes"), "step.nodes")
        per_node = step.get("tasks_per_node")
        if not isinstance(per_node, list) or not all(isinstance(n, int) for n in per_node):
            raise InvalidLaunch("step.tasks_per_node must be a list of integers")
        node_gpus = [int(g) for g in request.job["allocation"][launcher.node].get("gpus", ())]
        if not set(gpus) <= set(node_gpus):
            raise InvalidLaunch("a task's GPUs must be its job's")
        devices = self._devices(gpus)
        given = step.get("env")
        exported = {str(k): str(v) for k, v in given.items()} if isinstance(given, dict) else {}
        env = launcher.environment(
            request, identity, files, constrained=bool(devices), base=exported
        )
        env.update(
            step_environment(
                request.job,
                launcher.node,
                step_id=run.step_id,
                step_nodes=nodes,
                tasks_on_nodes=per_node,
                rank=rank,
                local_id=local,
                node_ranks=ranks,
                gpus=gpus,
                cluster_name=request.cluster_name or launcher.cluster_name,
                submit_host=request.spec.submit_host,
                container=bool(devices),
                gpu_vendor=launcher.gpu_vendor,
            )
        )
        return self._sandboxed(
            run,
            identity,
            files,
            limits,
            devices,
            [cwd, *argv],
            env,
            rank=rank,
            local=local,
            cpus=task_cpus(limits.cpus, step, local, len(ranks)),
            stdin=_stdin(step) if rank == 0 else b"",
        )

    def _devices(self, gpus: list[int]) -> list[DeviceNode]:
        return task_devices(self.launcher.cdi, gpus)

    def _sandboxed(self, run: StepRun, *args: Any, **kwargs: Any) -> JobTask:
        taskdir = self._dir / f"{run.job_id}.{run.attempt}.{run.step_id}.{kwargs['rank']}"
        cgroup = f"{run.job_id}.{run.attempt}"
        return start_task(self.launcher, taskdir, *args, cgroup=cgroup, **kwargs)

    def _wait_task(self, task: JobTask) -> tuple[int, int]:
        if task.status is None:
            returncode = task.monitor.wait()
            task.status = decode_status(returncode, task.process.delivered)
        return task.status

    def _reap(self, run: StepRun) -> None:
        for task in run.tasks:
            with contextlib.suppress(Exception):
                self._wait_task(task)
            for pipe in (task.monitor.stdout, task.monitor.stderr):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()
            task.process.reap()  # kills what the task left running in its sandbox
        with self._lock:
            self._runs.pop(run.key, None)
        run.done.set()


def task_cpus(
    job_cpus: frozenset[int], step: Mapping[str, Any], local: int, tasks_here: int
) -> frozenset[int]:
    """The CPUs a task is bound to: the job's on this node, or with --cpu-bind=cores its
    own share of them (cpus-per-task each, in order), when the job's CPUs are known and
    enough; otherwise the job's, which is all the allocation allows."""
    if step.get("cpu_bind") != "cores" or not job_cpus:
        return job_cpus
    ordered = sorted(job_cpus)
    per = max(int(step.get("cpus_per_task") or 1), 1)
    if tasks_here * per > len(ordered):
        return job_cpus
    return frozenset(ordered[local * per : (local + 1) * per])


def _stdin(step: Mapping[str, Any]) -> bytes:
    text = step.get("stdin") or ""
    if not isinstance(text, str):
        raise InvalidLaunch("step.stdin must be base64 text")
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise InvalidLaunch("step.stdin must be base64 text") from None


def _line(value: dict[str, Any]) -> bytes:
    return (json.dumps(value, separators=(",", ":")) + "\n").encode()


def _int(payload: Mapping[str, Any], key: str) -> int:
    value = payload.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidLaunch(f"{key} must be a non-negative integer")
    return value


def _strings(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidLaunch(f"{what} must be a list of strings")
    return list(value)


def _task_entry(entry: Any) -> tuple[int, int, list[int]]:
    if (
        not isinstance(entry, list)
        or len(entry) != 3
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in entry[:2])
        or not isinstance(entry[2], list)
        or not all(isinstance(g, int) for g in entry[2])
    ):
        raise InvalidLaunch("each task is [rank, local id, [gpus]]")
    return int(entry[0]), int(entry[1]), [int(g) for g in entry[2]]


__all__ = ["SRUN_PATH", "StepRefused", "StepRun", "StepRunner", "data_fd", "srun_client"]
