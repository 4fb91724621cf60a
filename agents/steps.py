"""Job steps on this node: the tasks `srun` starts, each contained as its job is.

A step launch comes from `srun` (or the web, for srun outside the job), never with the
cluster token, signed by the controller for this node over the whole step
(scheduler/rpc/signatures.py, `step_launch_fields`), and expiring within minutes. It
names a job attempt this agent launched (its batch step on the first node, or its share
of the allocation on the others): the tasks run as that job's identity, in its
organisation's workspace, with its GPUs' device nodes only, bound to its CPUs and in its
cgroup, each in a sandbox of its own (agents/sandbox.py) under its own supervisor
(agents/supervisor.py: the node's fencing lease kills them as it kills the batch
script). Each `(job, attempt, step)` launches once: its directory in the spool is
claimed first, and a replayed launch finds it.

    <spool>/steps/<job>.<attempt>.<step>/step.json   what an agent that restarts needs
                                        /delivered   a stream sent every task's end
                                        /<rank>/     the task's supervisor directory and
                                                     its streams (agents/step_io.py)

The launch's answer, and every later attach (`POST .../steps/{step}/attach`, with the
step's I/O credential the controller made for this node), is the step's stream
(agents/step_run.py): the tasks' output from the offsets the client names, then each
task's end. Their input (srun's stdin: to every task by default, as Slurm's
`--input=all`, to one with `-i N`, to none with `-i none`) arrives in pieces, each
written before it is answered (back-pressure) and refused unless it starts where the
input has reached (a replay writes nothing). A `--pty` step's task 0 runs on a
terminal (the others' output goes nowhere, as in Slurm).

A step outlives this agent: its tasks write into FIFOs that their supervisors hold
open, and the agent's journal of their output is on disk. A restarted agent adopts them
(`recover`), keeps their statuses, and srun reconnects and goes on where it stopped.
A step with no stream attached for `detach_grace_s` (its srun is gone for good) is
killed, and reported cancelled to the controller (`on_orphan`), as Slurm ends a step
whose srun died; so is the end of the job (its batch script's end, a cancel, or the
heartbeat's kill list).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import signal as signals
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.jobprocess import process_start_time, still_running
from agents.jobtask import JobTask, adopt_task, data_fd, start_task, task_devices
from agents.launch_request import InvalidLaunch, LaunchError, LaunchRequest
from agents.limits import JobLimits
from agents.sandbox import DeviceNode
from agents.step_io import SETSID, Journal, hold, open_output, open_terminal, take_fd
from agents.step_launch import (
    JOURNALS,
    TaskStreams,
    input_ranks,
    integer,
    pty_size,
    strings,
    task_cpus,
    task_entry,
)
from agents.step_run import Source, StepRun
from agents.supervisor import RELEASE_S, release, supervisors_of
from scheduler.config import AgentConfig
from scheduler.rpc.signatures import STEP_TTL_S
from scheduler.slurm.jobenv import step_environment

if TYPE_CHECKING:
    from agents.identity import Identity
    from agents.launcher import Launcher
    from agents.workspace import JobFiles

log = logging.getLogger(__name__)

SRUN_PATH = "/run/spur/bin/srun"
TOOLS_DIR = "/run/spur/bin"
STEP_RECORD = "step.json"
DELIVERED = "delivered"
# A step nobody streams is killed after this (its srun is gone): spur.toml's default.
DETACH_GRACE_S = AgentConfig.step_grace_s
LINGER_S = 60.0  # an ended step's spool is kept this long, for a last reconnect
JOB_LAUNCH_WAIT_S = 15.0  # a step's launch may overtake its job's (the worker carries it)
_REAP_EVERY_S = 1.0

# How a step ended when nobody was left to stream it: (run, exit code, signal, whether
# it was killed for it). The agent reports it to the controller (agents/main.py).
OrphanReport = Callable[[StepRun, int, int, bool], None]


class StepRefused(Exception):
    """A step this node will not run (the API answers 409)."""

    def __init__(self, message: str, *, code: str = "conflict") -> None:
        super().__init__(message)
        self.code = code


class StepRunner:
    def __init__(self, launcher: Launcher, *, detach_grace_s: float = DETACH_GRACE_S) -> None:
        self.launcher = launcher
        self.detach_grace_s = detach_grace_s
        self.on_orphan: OrphanReport | None = None
        self._lock = threading.Lock()
        self._runs: dict[tuple[int, int, int], StepRun] = {}
        self._shells = 0  # the last step id given to a shell (start_shell), counting down
        self._dir = Path(launcher.spool_dir) / "steps"
        self._reaper: threading.Thread | None = None

    # -- the API's operations ------------------------------------------------------

    def start(self, payload: Mapping[str, Any]) -> StepRun:
        """Start the step's tasks on this node (the signature was checked by the caller)."""
        job_id, attempt, step_id = (integer(payload, k) for k in ("job_id", "attempt", "step_id"))
        step = payload.get("step")
        if not isinstance(step, dict):
            raise InvalidLaunch("step must be an object")
        job = payload.get("job")
        first = (job.get("nodes") or [None])[0] if isinstance(job, dict) else None
        if first == self.launcher.node:
            request = self.launcher.await_job(job_id, attempt, JOB_LAUNCH_WAIT_S)
        else:
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
        tasks = step.get("tasks")
        if not isinstance(tasks, list) or not tasks:
            raise InvalidLaunch("step.tasks must be a non-empty list")
        entries = [task_entry(entry) for entry in tasks]
        pty = pty_size(step)
        ranks = [rank for rank, _, _ in entries]
        inputs = input_ranks(step, ranks, pty=pty is not None)
        stepdir = self._dir / f"{job_id}.{attempt}.{step_id}"
        run = StepRun(job_id, attempt, step_id, stepdir=stepdir, tenant=request.spec.tenant,
                      input_ranks=inputs)  # fmt: skip
        self._claim(run, pty=pty is not None)
        try:
            identity, files, _, limits = self._placed(request)
            for rank, local, gpus in entries:
                self._spawn(request, step, run, identity, files, limits, rank, local, gpus,
                            ranks=ranks, pty=pty)  # fmt: skip
        except BaseException:
            self._abandon(run)
            raise
        with self._lock:
            self._runs[run.key] = run
        run.start_pump()
        self._start_reaper()
        log.info(
            "step %s.%s (attempt %s): %d task(s) started", job_id, step_id, attempt, len(run.tasks)
        )
        return run

    def find(self, job_id: int, attempt: int, step_id: int) -> StepRun | None:
        """The step's run here, if it has one (started or adopted, not yet cleaned up)."""
        with self._lock:
            return self._runs.get((job_id, attempt, step_id))

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
        job as steps are. Its step id is negative: `scancel N.S` never names it, and it
        does not outlive the agent (its terminal is the agent's)."""
        if (tty is None) == (stdio is None):
            raise ValueError("a shell has a terminal or its own stdio, one of them")
        request = self.launcher.job_request(job_id, attempt)
        if request is None or request.first_node != self.launcher.node:
            raise StepRefused(f"job {job_id} (attempt {attempt}) does not run on this node")
        with self._lock:
            self._shells -= 1
            stepdir = self._dir / f"{job_id}.{attempt}.{self._shells}"
            run = StepRun(job_id, attempt, self._shells, stepdir=stepdir)
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
                start_task(
                    self.launcher, stepdir / "0", identity, files, limits, devices,
                    [cwd, *argv], full, rank=0, local=0, cpus=limits.cpus, tty=tty,
                    stdio=stdio, cgroup=f"{job_id}.{attempt}",
                )
            )  # fmt: skip
        except BaseException:
            self.end(run)
            raise
        return run

    def wait_shell(self, run: StepRun) -> tuple[int, int]:
        """(exit code, signal) of a shell's task once it has ended (blocks until then)."""
        task = run.tasks[0]
        if task.monitor is not None:
            task.monitor.wait()
        return task.ended()

    def end(self, run: StepRun) -> None:
        """Kill what is left of a shell and wait for it (blocks until it is gone)."""
        run.signal(signals.SIGKILL)
        for task in run.tasks:
            with contextlib.suppress(Exception):
                task.process.wait_gone()
                task.ended()
        with self._lock:
            self._runs.pop(run.key, None)
        run.close()
        shutil.rmtree(run.stepdir, ignore_errors=True)
        run.done.set()

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
        """The job attempts with a task running here (the heartbeat lists them)."""
        with self._lock:
            runs = list(self._runs.values())
        return sorted(
            {(r.job_id, r.attempt) for r in runs if any(t.status is None for t in r.tasks)}
        )

    def stop(self) -> None:
        """Stop watching every step, leaving their tasks running (the agent exits; the
        next one adopts them)."""
        with self._lock:
            runs = list(self._runs.values())
        for run in runs:
            run.stop()

    # -- starting one step ---------------------------------------------------------------

    def _claim(self, run: StepRun, *, pty: bool) -> None:
        """The step's directory, made once: a launch that finds it was launched here."""
        self._dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        with self._lock:
            known = run.key in self._runs
        if known:
            raise StepRefused(f"step {run.label} was launched here already", code="step_launched")
        try:
            run.stepdir.mkdir(mode=0o700)
        except FileExistsError:
            raise StepRefused(
                f"step {run.label} was launched here already", code="step_launched"
            ) from None
        record = {
            "job_id": run.job_id,
            "attempt": run.attempt,
            "step_id": run.step_id,
            "tenant": run.tenant,
            "input_ranks": sorted(run.input_ranks),
            "pty": pty,
            "created": run.created,
        }
        (run.stepdir / STEP_RECORD).write_text(json.dumps(record))

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

    def _spawn(
        self,
        request: LaunchRequest,
        step: Mapping[str, Any],
        run: StepRun,
        identity: Identity,
        files: JobFiles,
        limits: JobLimits,
        rank: int,
        local: int,
        gpus: list[int],
        *,
        ranks: list[int],
        pty: tuple[int, int] | None,
    ) -> None:
        launcher = self.launcher
        argv = strings(step.get("argv"), "step.argv")
        cwd = step.get("cwd")
        if not argv or not isinstance(cwd, str):
            raise InvalidLaunch("a step needs argv and cwd")
        nodes = strings(step.get("nodes"), "step.nodes")
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
        taskdir = run.stepdir / str(rank)
        taskdir.mkdir(mode=0o700)
        terminal = pty is not None and rank == 0
        if terminal:
            argv = [SETSID, "--ctty", "--wait", *argv]
        # A --pty step's tasks have no FIFOs: task 0 reopens its stdio on its terminal, and
        # Slurm sends the others' output nowhere.
        streams = TaskStreams(taskdir, quiet=pty is not None, reads_input=rank in run.input_ranks)
        try:
            task = start_task(
                launcher, taskdir, identity, files, limits, devices, [cwd, *argv], env,
                rank=rank, local=local, cpus=task_cpus(limits.cpus, step, local, len(ranks)),
                stdio=streams.stdio, hold=streams.hold, errors=streams.errors,
                terminal=terminal, cgroup=f"{run.job_id}.{run.attempt}",
            )  # fmt: skip
            if streams.input_writer >= 0:  # its end of input waits for srun's
                run.holders[(rank, "stdin")] = hold(taskdir, streams.input_writer, "stdin",
                                                    RELEASE_S)  # fmt: skip
        except BaseException:
            streams.close_ours()
            raise
        finally:
            streams.close_theirs()
        run.tasks.append(task)
        for key, fd, name in streams.fifos:
            journal = Journal(taskdir, JOURNALS[name])
            run.sources.append(Source(task, key, journal, fd, taskdir / name))
        if terminal:
            try:
                master = open_terminal(task.process.init_pid, identity.uid, identity.gid, pty)
            except OSError as exc:
                raise LaunchError(f"cannot open the task's terminal: {exc}") from exc
            run.master = master
            holder = hold(taskdir, master, "tty", RELEASE_S)
            run.holders[(rank, "tty")] = holder
            task.extra["holder"] = [holder.pid, process_start_time(holder.pid), master]
            run.sources.append(Source(task, "o", Journal(taskdir, "out"), master, None))
        task.record()

    def _abandon(self, run: StepRun) -> None:
        """A step that could not start all its tasks: those that did are killed."""
        run.signal(signals.SIGKILL)
        for task in run.tasks:
            with contextlib.suppress(Exception):
                task.process.wait_gone(10)
                task.ended()
        for source in run.sources:
            if source.fd >= 0 and source.fifo is not None:
                os.close(source.fd)
        if run.master >= 0:
            os.close(run.master)
            run.master = -1
        for holder in run.holders.values():
            holder.kill()
            holder.wait()
        for source in run.sources:
            source.fd = -1
        # Kept (a replayed launch finds it) until the sweep removes it.
        (run.stepdir / DELIVERED).touch()
        run.delivered_at = time.monotonic()
        run.done.set()
        with self._lock:
            self._runs[run.key] = run
        self._start_reaper()

    def _devices(self, gpus: list[int]) -> list[DeviceNode]:
        return task_devices(self.launcher.cdi, gpus)

    # -- after a restart -----------------------------------------------------------------

    def recover(self) -> list[tuple[int, int, int]]:
        """Adopt the steps an earlier run of this agent started: their tasks, alive or
        ended (their supervisors keep their statuses), and their streams. Shells (whose
        terminal died with that agent) and steps it did not finish starting are stopped."""
        adopted: list[tuple[int, int, int]] = []
        for stepdir in sorted(self._dir.iterdir()) if self._dir.is_dir() else []:
            try:
                record = json.loads((stepdir / STEP_RECORD).read_text())
                key = (int(record["job_id"]), int(record["attempt"]), int(record["step_id"]))
            except (OSError, ValueError, KeyError, TypeError):
                self._discard(stepdir)
                continue
            run = StepRun(*key, stepdir=stepdir, tenant=str(record.get("tenant", "")),
                          input_ranks=frozenset(int(r) for r in record.get("input_ranks", ())),
                          created=float(record.get("created", 0)))  # fmt: skip
            taskdirs = sorted((p for p in stepdir.iterdir() if p.name.isdigit()),
                              key=lambda p: int(p.name))  # fmt: skip
            for taskdir in taskdirs:
                task = adopt_task(taskdir)
                if task is None:  # never written down: it may run, nobody knows how
                    _stop_supervisors(taskdir)
                    continue
                run.tasks.append(task)
                self._adopt_streams(run, task)
            if (stepdir / DELIVERED).exists():
                run.delivered_at = time.monotonic()
            with self._lock:
                self._runs[run.key] = run
            run.start_pump()
            adopted.append(run.key)
            log.info("step %s (attempt %s): %d task(s) adopted", run.label, run.attempt,
                     len(run.tasks))  # fmt: skip
        if adopted:
            self._start_reaper()
        return adopted

    def _adopt_streams(self, run: StepRun, task: JobTask) -> None:
        taskdir = task.taskdir
        holder = task.extra.get("holder")
        if isinstance(holder, list) and len(holder) == 3:
            master = -1
            pid, start, fd = (int(v) for v in holder)
            try:
                if not still_running(pid, start):
                    raise OSError(errno.ESRCH, "its holder is gone")
                pidfd = os.pidfd_open(pid)
                try:
                    master = take_fd(pidfd, fd)
                finally:
                    os.close(pidfd)
                os.set_blocking(master, False)
                run.master = master
            except OSError as exc:
                if not task.gone():
                    log.warning("step %s task %d: its terminal cannot be taken back (%s): it "
                                "is killed", run.label, task.rank, exc)  # fmt: skip
                    task.signal(signals.SIGKILL)
            run.sources.append(Source(task, "o", Journal(taskdir, "out"), master, None))
            return
        for key, name in (("o", "stdout"), ("e", "stderr")):
            if (taskdir / name).exists():
                journal = Journal(taskdir, JOURNALS[name])
                run.sources.append(Source(task, key, journal, open_output(taskdir / name),
                                          taskdir / name))  # fmt: skip

    def _discard(self, stepdir: Path) -> None:
        """A step directory nobody can adopt: what still runs in it is stopped."""
        for taskdir in (p for p in stepdir.iterdir() if p.is_dir()):
            _stop_supervisors(taskdir)
        shutil.rmtree(stepdir, ignore_errors=True)

    # -- steps nobody streams, and ended steps' spool ---------------------------------------

    def _start_reaper(self) -> None:
        with self._lock:
            if self._reaper is not None:
                return
            self._reaper = threading.Thread(target=self._reap, name="spurd-steps", daemon=True)
        self._reaper.start()

    def _reap(self) -> None:
        while True:
            time.sleep(_REAP_EVERY_S)
            try:
                self.sweep()
            except Exception:
                log.exception("the steps' sweep failed")

    def sweep(self, now: float | None = None) -> None:
        """Kill the steps nobody has streamed for `detach_grace_s`, and remove the spool of
        those that ended and were delivered (or given up) more than LINGER_S ago, once
        their launch can no longer be replayed."""
        now = time.monotonic() if now is None else now
        with self._lock:
            runs = [r for r in self._runs.values() if r.step_id >= 0]
        for run in runs:
            with run.lock:
                detached = run.detached_since
                delivered = run.delivered_at
            if delivered is not None and not (run.stepdir / DELIVERED).exists():
                with contextlib.suppress(OSError):
                    (run.stepdir / DELIVERED).touch()
            if (
                not run.orphaned
                and delivered is None
                and detached is not None
                and now - detached > self.detach_grace_s
            ):
                run.orphaned = True
                threading.Thread(target=self._orphaned, args=(run,), daemon=True).start()
            ended = delivered if delivered is not None else (now if run.orphaned else None)
            if (
                run.done.is_set()
                and ended is not None
                and now - ended >= LINGER_S
                and time.time() - run.created > STEP_TTL_S
            ):
                self._remove(run)

    def _orphaned(self, run: StepRun) -> None:
        cancelled = not run.done.is_set()
        if cancelled:
            log.warning("step %s: no srun for %.0f s: its tasks are killed", run.label,
                        self.detach_grace_s)  # fmt: skip
            run.signal(signals.SIGKILL)
        run.done.wait(60)
        statuses = [t.status or (0, int(signals.SIGKILL)) for t in run.tasks]
        exit_code = max((code for code, _ in statuses), default=0)
        signum = max((sig for _, sig in statuses), default=0)
        with run.lock:
            run.delivered_at = time.monotonic()
        if self.on_orphan is not None:
            try:
                self.on_orphan(run, 0 if signum else exit_code, signum, cancelled)
            except Exception:
                log.exception("the end of step %s was not reported", run.label)

    def _remove(self, run: StepRun) -> None:
        with self._lock:
            self._runs.pop(run.key, None)
        run.close()
        shutil.rmtree(run.stepdir, ignore_errors=True)


def _stop_supervisors(taskdir: Path) -> None:
    for pid in supervisors_of(taskdir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signals.SIGKILL)
    release(taskdir)


__all__ = [
    "DETACH_GRACE_S",
    "SRUN_PATH",
    "StepRefused",
    "StepRun",
    "StepRunner",
    "data_fd",
]
