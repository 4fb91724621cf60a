"""Runs batch jobs, each contained, and tells the controller when they start and end.

Every job runs as an unprivileged identity (agents/identity.py) inside a sandbox
(agents/sandbox.py) that shows it its organisation's workspace (agents/workspace.py),
the host's system directories read-only, and the device nodes of its own GPUs, bound to
its CPUs and held to its memory and process limits (agents/limits.py). Its processes
are held through agents/jobprocess.py. This module decides the order of things and
keeps the spool.

Threads, not asyncio: every job needs a blocking wait, the API (Starlette, async) calls
`launch` through its thread pool, the heartbeat loop and the report sender are threads
too. A node runs tens of jobs at once, not thousands, so one waiter thread per running
job costs nothing that matters (they are kept for the next jobs: `_Waiters`).

Layout of the spool directory (root's, never visible inside a sandbox), one directory
per `(job_id, attempt)`:

    <spool>/jobs/<id>.<attempt>/launch.json   the job's record (agents/jobrecord.py): the
                                              payload (to recognise a re-sent launch, and
                                              the batch script with it), then a line for
                                              each fact that follows: the sandbox's monitor
                                              (its job supervisor's), where it runs and
                                              writes, as whom, its processes, the signals
                                              delivered, its status, its reported end
                               /fenced        once the node's lease ran out
                               /launch-error  why it could not start, if it could not
    <spool>/supervisor/<pid>.lease            a job supervisor's lease renewals (a FIFO,
                                              agents/jobsupervisor.py)
    <spool>/outbox/journal                    reports not yet acknowledged (agents/reports.py)
    <spool>/steps/<id>.<attempt>.<step>/      a job step's tasks and their streams, which
                                              outlive the agent (agents/steps.py)

Reports are durable: `started` and `finished` go to the outbox before anything else is
done about them, and are resent until the controller acknowledges them, across agent
restarts. A job adopted after a restart reports the exit its supervisor recorded.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import queue
import signal as signals
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents import jobrecord, slurm_cli
from agents.cdi import device_nodes, read_cdi_spec
from agents.credentials import NodeCredential
from agents.identity import Identities, Identity, IdentityRefused
from agents.jobprocess import JobProcess, SandboxError, decode_status, still_running
from agents.launch_request import InvalidLaunch, LaunchError, LaunchRequest, StaleLaunch
from agents.limits import DEFAULT_PIDS_MAX, Enforcement, JobLimits, read_tail
from agents.limits import detect as detect_limits
from agents.output import read_output
from agents.reports import Reporter
from agents.sandbox import (
    SCRIPT_PATH,
    Bubblewrap,
    DeviceNode,
    Sandbox,
    data_fd,
    device_groups,
    first_shell,
    reopen,
)
from agents.steps import DETACH_GRACE_S, TOOLS_DIR, StepRunner
from agents.supervisor import JobSupervisor, Lease, Supervised, renew, supervisors_of
from agents.workspace import (
    DEV_NULL,
    JobFiles,
    WorkspaceRefused,
    Workspaces,
    job_files,
    open_beneath,
    safe_component,
)
from scheduler.client import JobReport
from scheduler.rpc import signatures
from scheduler.slurm.filenames import expand_output
from scheduler.slurm.jobenv import job_environment

log = logging.getLogger(__name__)

DEFAULT_OUTPUT = "slurm-%j.out"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
OUT_OF_MEMORY = "OutOfMemory"  # the reason the controller maps to OUT_OF_MEMORY
# Signals that end a job: a stopped (suspended) job only acts on them once continued.
_ENDING = frozenset({signals.SIGTERM, signals.SIGINT, signals.SIGHUP, signals.SIGQUIT})
# scontrol suspend and resume.
_SUSPENDING = frozenset({signals.SIGSTOP, signals.SIGCONT})

LAUNCH_CONCURRENCY = 8  # a batch's launches starting at once (each mostly waits on a spawn)

_INTERRUPTED_LAUNCH = "spurd restarted while launching the job: it was stopped"
_LOST_STATUS = "spurd restarted while the job ran: its exit status is unknown"
_SUPERVISOR_LOST = "the node's job supervisor died: the job ended with it, its exit status unknown"
_STATUS_S = 5.0  # how long a job's status may take to be written once its monitor ended
FENCED = "fenced: the node's lease ran out (no heartbeat the controller acknowledged)"

__all__ = ["InvalidLaunch", "LaunchError", "LaunchRequest", "Launcher"]


@dataclass
class _Job:
    request: LaunchRequest
    pid: int | None = None
    process: JobProcess | None = None
    exit_code: int | None = None
    signal: int | None = None
    reason: str = ""
    finished: threading.Event = field(default_factory=threading.Event)


class Launcher:
    def __init__(
        self,
        *,
        node: str,
        spool_dir: str | os.PathLike[str],
        reporter: Reporter,
        work_root: str | os.PathLike[str],
        identities: Identities,
        cluster_name: str = "spur",
        gpu_vendor: str = "",
        sandbox: Sandbox | None = None,
        limits: Enforcement | None = None,
        cdi_spec: str | os.PathLike[str] | None = None,
        pids_max: int = DEFAULT_PIDS_MAX,
        lease: Lease | None = None,
        credential: NodeCredential | None = None,
        controllers: Sequence[str] = (),
        step_grace_s: float = DETACH_GRACE_S,
    ) -> None:
        """`lease`: the node's fencing lease (agents/supervisor.py); each job is killed
        by its supervisor when it runs out. None: jobs are not fenced (tests, benches).
        `credential` and `controllers`: what a job's step credential is made with, and
        where its `srun` creates steps (agents/steps.py); without them a job has no srun.
        `step_grace_s`: how long a step runs on with no srun streaming it."""
        self.node = node
        self.spool_dir = Path(spool_dir)
        self.credential = credential
        self.controllers = tuple(controllers)
        self.lease = lease
        self.cluster_name = cluster_name
        self.gpu_vendor = gpu_vendor
        self.identities = identities
        self.workspaces = Workspaces(work_root)
        self.workspaces.prepare()
        self.sandbox = sandbox if sandbox is not None else Bubblewrap(hidden=[str(spool_dir)])
        self.limits = limits if limits is not None else detect_limits()
        self.pids_max = pids_max
        self._cdi = read_cdi_spec(cdi_spec)
        self.cdi = self._cdi
        self._usable_cpus = frozenset(os.sched_getaffinity(0))
        self.usable_cpus = self._usable_cpus
        self._jobs_dir = Path(spool_dir) / "jobs"
        self._reporter = reporter
        self._lock = threading.Lock()
        self._jobs: dict[tuple[int, int], _Job] = {}
        self._waiters = _Waiters()
        # A batch's launches start side by side (launch_all); threads kept between batches.
        self._starts = ThreadPoolExecutor(LAUNCH_CONCURRENCY, thread_name_prefix="spurd-start")
        self.steps = StepRunner(self, detach_grace_s=step_grace_s)
        self._tools: list[tuple[int, str]] | None = None
        self._tool_dirs: list[tuple[str, str]] | None = None
        self._supervisor = JobSupervisor(
            self.spool_dir / "supervisor",
            lambda: None if self.lease is None else self.lease.left(),
        )

    # -- the API's operations -------------------------------------------------------

    def launch(self, request: LaunchRequest) -> bool:
        """Start the batch step if this node is the job's first; True for a duplicate."""
        entry, duplicate = self._admit(request)
        return duplicate if entry is None else self._begin(entry)

    def launch_all(self, requests: Sequence[LaunchRequest]) -> list[bool | Exception]:
        """Several launches (a controller's batch): admitted in order, then started all
        at once and waited for (a start spends its ~10 ms mostly spawning the sandbox,
        not on this CPU). For each: `launch`'s answer, or the error that refused it."""
        results: list[bool | Exception] = []
        starting: list[tuple[int, _Job]] = []
        for request in requests:
            try:
                entry, duplicate = self._admit(request)
            except (InvalidLaunch, StaleLaunch, LaunchError) as exc:
                results.append(exc)
                continue
            results.append(duplicate)
            if entry is not None:
                starting.append((len(results) - 1, entry))
        if len(starting) == 1:
            index, entry = starting[0]
            starting = []
            try:
                results[index] = self._begin(entry)
            except (LaunchError, OSError) as exc:
                results[index] = exc
        futures = [(i, self._starts.submit(self._begin, entry)) for i, entry in starting]
        for index, future in futures:
            try:
                results[index] = future.result()
            except (LaunchError, OSError) as exc:
                results[index] = exc
        return results

    def _admit(self, request: LaunchRequest) -> tuple[_Job | None, bool]:
        """Take the launch in (under the lock, in the order launches come): its entry to
        start, or None and whether it was a duplicate."""
        if request.node != self.node:
            raise InvalidLaunch(f"launch for node {request.node} sent to node {self.node}")
        entry = _Job(request)
        with self._lock:
            if request.key in self._jobs:
                return None, True
            if self.lease is not None and self.lease.left() <= 0:
                # Its supervisor would kill it at once: not before the leader hears from
                # this node (503: the worker retries).
                raise LaunchError(f"node {self.node} holds no lease: no heartbeat acknowledged")
            if self.lease is not None and request.epoch < self.lease.epoch:
                raise StaleLaunch(
                    f"job {request.job_id}.{request.attempt} was launched before node "
                    f"{self.node} was declared lost (epoch {request.epoch} < "
                    f"{self.lease.epoch}): it was ended then"
                )
            self._jobs[request.key] = entry
        if request.first_node != self.node:
            # The batch script runs once, on the first node; `srun` reaches the others.
            entry.finished.set()
            return None, False
        return entry, False

    def _begin(self, entry: _Job) -> bool:
        """Start an admitted launch's batch step; True when an earlier run of this agent
        had launched it already."""
        request = entry.request
        jobdir = self._jobdir(*request.key)
        if not self._claim(jobdir, request):
            # Launched by an earlier run of this agent: never run a job twice.
            log.info("job %s.%s was launched before this agent started", *request.key)
            entry.finished.set()
            return True
        self._start(entry, jobdir)
        return False

    def signal(
        self, job_id: int, attempt: int, signum: int, *, kill_after_s: float | None = None
    ) -> bool:
        """Signal every process of the job; False when it does not run here. SIGSTOP and
        SIGCONT (scontrol suspend, resume) freeze and thaw its cgroup where it has one."""
        with self._lock:
            entry = self._jobs.get((job_id, attempt))
        if signum in _SUSPENDING:
            return self._suspend(job_id, attempt, entry, stop=signum == signals.SIGSTOP)
        # Its steps' tasks on this node, wherever the batch script runs.
        stepped = self.steps.signal(job_id, attempt, signum)
        if signum in _ENDING or signum == signals.SIGKILL:
            # A suspended job must run on to act on it (a frozen one to die of it).
            self.limits.freeze(self._jobdir(job_id, attempt).name, False)
            if signum in _ENDING:
                self.steps.signal(job_id, attempt, signals.SIGCONT)
        if entry is None or entry.process is None or entry.finished.is_set():
            return stepped
        if not entry.process.signal(signum, then_continue=signum in _ENDING):
            return stepped
        _record_signal(self._jobdir(job_id, attempt), signum)
        if kill_after_s is not None:
            timer = threading.Timer(max(kill_after_s, 0.0), self._escalate, args=(entry,))
            timer.daemon = True
            timer.start()
        log.info("job %s.%s: signal %d delivered", job_id, attempt, signum)
        return True

    def _suspend(self, job_id: int, attempt: int, entry: _Job | None, *, stop: bool) -> bool:
        """Stop or continue the whole job here, its steps' tasks included: by its cgroup
        (which its steps share) where it has one, else by SIGSTOP or SIGCONT to each of
        its processes (never to a sandbox's init or monitor, so that its supervisor waits
        on as before). Neither is recorded as delivered: they end nothing."""
        signum = signals.SIGSTOP if stop else signals.SIGCONT
        if self.limits.freeze(self._jobdir(job_id, attempt).name, stop):
            log.info("job %s.%s: %s", job_id, attempt, "frozen" if stop else "thawed")
            return True
        stepped = self.steps.signal(job_id, attempt, signum)
        if entry is None or entry.process is None or entry.finished.is_set():
            return stepped
        delivered = entry.process.signal(signum)
        log.info("job %s.%s: signal %d delivered", job_id, attempt, signum)
        return delivered or stepped

    def running(self) -> list[dict[str, Any]]:
        with self._lock:
            entries = list(self._jobs.values())
        listed: list[dict[str, Any]] = [
            {"job_id": e.request.job_id, "attempt": e.request.attempt, "pid": e.pid}
            for e in entries
            if e.pid is not None and not e.finished.is_set()
        ]
        # A job whose steps run here (its batch script on another node): the heartbeat's
        # answer kills them once the controller no longer knows the job.
        known = {(j["job_id"], j["attempt"]) for j in listed}
        listed += [
            {"job_id": job_id, "attempt": attempt, "pid": None}
            for job_id, attempt in self.steps.running()
            if (job_id, attempt) not in known
        ]
        return listed

    def wait(self, job_id: int, attempt: int, timeout: float | None = None) -> bool:
        """Block until the job has ended here (and its report is queued)."""
        with self._lock:
            entry = self._jobs.get((job_id, attempt))
        return entry is not None and entry.finished.wait(timeout)

    def renew_lease(self) -> None:
        """Pass the node's lease on to the supervisor of every job that runs here (after
        each acknowledged heartbeat)."""
        if self.lease is None:
            return
        with self._lock:
            entries = list(self._jobs.values())
        left = self.lease.left()
        self._supervisor.renew(left)
        # Tasks have supervisors of their own (agents/jobtask.py), and so do jobs an agent
        # of an earlier version started.
        keys = [e.request.key for e in entries if e.pid is not None and not e.finished.is_set()]
        dirs = [self._jobdir(*key) for key in keys] + self.steps.lease_dirs()
        renew(dirs, left)

    def close(self) -> None:
        """Let the job supervisor go: the jobs it started run on (for tests and tools
        that make launchers of their own; an agent's leaves with its process)."""
        self._supervisor.close()

    def output(self, job_id: int, *, stream: str, offset: int, limit: int) -> dict[str, Any] | None:
        """A piece of the job's output (agents/output.py); None if it never ran here."""
        return read_output(self._jobs_dir, job_id, stream=stream, offset=offset, limit=limit)

    def recover(self, *, poll_s: float = 1.0) -> list[tuple[int, int]]:
        """Adopt the jobs an earlier run of this agent started and that still run;
        report those that ended while no agent watched.

        Called once at start-up, before the first heartbeat, so the controller hears
        that they run instead of failing them. They are not our children any more, but
        their supervisors are still their parents and record their status: when one
        ends it is reported with its real exit. Only a job whose supervisor left no
        status (it was killed itself) is reported as exit code 1 with a reason that says
        so (a false failure can be re-run; a false success would release `afterok`
        dependents on work that may have failed). Jobs whose end was recorded (`exit`)
        need nothing: their report, until acknowledged, is in the outbox.

        Their steps are adopted first (agents/steps.py), so that a job found ended takes
        its steps on this node with it.
        """
        steps = self.steps.recover()
        if steps:
            log.info("adopted %d step(s) left running by an earlier spurd", len(steps))
        adopted = []
        for jobdir in sorted(self._jobs_dir.glob("*.*")) if self._jobs_dir.is_dir() else []:
            job_id, _, attempt = jobdir.name.partition(".")
            if not (job_id.isdigit() and attempt.isdigit()):
                continue
            record = jobrecord.read(jobdir)
            if record.exit is not None:
                continue
            if record.run is None:
                self._interrupted_launch(jobdir, record)
                continue
            try:
                pid_text = record.run["processes"]
                request = LaunchRequest.from_payload(record.launch)
            except (ValueError, KeyError):
                continue
            try:
                process = JobProcess.adopt(str(pid_text))
            except ValueError:
                process = None  # a pid file this agent does not write any more
            if process is not None:
                process.delivered.update(record.signals)
            entry = _Job(request, pid=process.init_pid if process else None, process=process)
            with self._lock:
                if request.key in self._jobs:
                    continue
                self._jobs[request.key] = entry
            if process is None:
                # It ended (and its pids may be someone else's now) while we were away;
                # its supervisor may be writing its status this very moment.
                _wait_supervisor(str(pid_text))
                self._finish(entry, jobdir, **self._ending(jobdir, _ended_status(jobdir)))
                continue
            threading.Thread(
                target=self._watch_adopted,
                args=(entry, jobdir, poll_s),
                name=f"spurd-adopted-{request.job_id}.{request.attempt}",
                daemon=True,
            ).start()
            log.info("job %s.%s (pid %d) still runs: adopted", *request.key, process.init_pid)
            adopted.append(request.key)
        return adopted

    def _interrupted_launch(self, jobdir: Path, record: jobrecord.JobRecord) -> None:
        """A launch an earlier run of this agent claimed but died before it knew the
        job ran (no `run` in its record): the job may never have started, may have died
        with the agent (its first shell writes to the agent), or may run with pids nobody
        wrote down but its supervisor. It is stopped (its sandbox's monitor, and with it
        the sandbox, `--die-with-parent`) and reported failed: running it again could run
        it twice, and leaving it would hold its GPUs for a job that never reports."""
        try:
            request = LaunchRequest.from_payload(record.launch)
        except ValueError:
            return  # never described: the launch, re-sent, is refused as not ours
        entry = _Job(request)
        with self._lock:
            if request.key in self._jobs:
                return
            self._jobs[request.key] = entry
        # Its sandbox's monitor, whose death takes the sandbox with it; or the shell
        # supervisor an agent of an earlier version gave it.
        pids = supervisors_of(jobdir)
        if record.running is not None and still_running(*record.running):
            pids.append(record.running[0])
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signals.SIGKILL)
        log.warning("job %s.%s: this agent died while launching it; it fails", *request.key)
        self._finish(entry, jobdir, exit_code=1, signal=0, reason=_INTERRUPTED_LAUNCH)

    def _watch_adopted(self, entry: _Job, jobdir: Path, poll_s: float) -> None:
        process = entry.process
        assert process is not None
        while process.monitor_running() and process.alive():
            time.sleep(poll_s)
        # The job is gone: its supervisor writes its status right after.
        deadline = time.monotonic() + _STATUS_S
        while process.monitor_running() and time.monotonic() < deadline:
            time.sleep(0.01)
        process.reap()
        self.limits.release(jobdir.name)
        self._finish(entry, jobdir, **self._ending(jobdir, _ended_status(jobdir), process))

    def _ending(
        self, jobdir: Path, status: int | None, process: JobProcess | None = None
    ) -> dict[str, Any]:
        """How a job ended, from its supervisor's status: `_finish`'s arguments."""
        if jobrecord.fenced(jobdir):
            return {"exit_code": 0, "signal": int(signals.SIGKILL), "reason": FENCED}
        if status is None:
            return {"exit_code": 1, "signal": 0, "reason": _LOST_STATUS}
        recorded = jobrecord.read(jobdir, launch=False).signals
        delivered = recorded | (process.delivered if process else set())
        exit_code, signum = decode_status(status, delivered)
        return {"exit_code": exit_code, "signal": signum, "reason": ""}

    def kill_all(self, *, timeout: float = 5.0) -> None:
        """SIGKILL every job of this agent and wait for their ends to be reported."""
        for job in self.running():
            self.signal(job["job_id"], job["attempt"], signals.SIGKILL)
        for job in self.running():
            self.wait(job["job_id"], job["attempt"], timeout)

    # -- what job steps need (agents/steps.py) ------------------------------------------

    def job_request(self, job_id: int, attempt: int) -> LaunchRequest | None:
        """The launch of a job attempt that holds this node now, or None: not launched
        here, or its batch script (if it ran here) has ended."""
        with self._lock:
            entry = self._jobs.get((job_id, attempt))
        if entry is None:
            return None
        if entry.request.first_node == self.node and entry.finished.is_set():
            return None
        return entry.request

    def await_job(self, job_id: int, attempt: int, timeout: float) -> LaunchRequest | None:
        """`job_request`, once the job's launch has come (a step's launch, which srun
        sends as soon as the job runs, may overtake it: the worker carries it)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                known = (job_id, attempt) in self._jobs
            if known or time.monotonic() > deadline:
                return self.job_request(job_id, attempt)
            time.sleep(0.05)

    def run_record(self, job_id: int, attempt: int) -> dict[str, Any] | None:
        """Where a started job attempt runs and as whom (its record's `run`), or None."""
        run = jobrecord.read(self._jobdir(job_id, attempt), launch=False).run
        return None if run is None else dict(run)

    def place(self, request: LaunchRequest) -> tuple[Identity, JobFiles]:
        return self._place(request)

    def environment(
        self,
        request: LaunchRequest,
        identity: Identity,
        files: JobFiles,
        *,
        constrained: bool,
        base: Mapping[str, str],
    ) -> dict[str, str]:
        """A step task's: `base` (what srun exported) in place of the submitted one."""
        return self._environment(request, identity, files, constrained=constrained, base=base)

    def tool_dirs(self) -> list[tuple[str, str]]:
        """srun and the Slurm commands (agents/slurm_cli.py) as directories for the
        sandbox to bind read-only, made once under the work root; none where they cannot
        be made there (`tool_files` and `tool_links` then give them)."""
        if self.credential is None:
            return []
        with self._lock:
            if self._tool_dirs is None:
                try:
                    self._tool_dirs = slurm_cli.install_for_sandbox(self.workspaces.root, TOOLS_DIR)
                except OSError as exc:
                    log.warning("the Slurm commands are copied into each sandbox: %s", exc)
                    self._tool_dirs = []
            return self._tool_dirs

    def tool_files(self) -> list[tuple[int, str]]:
        """srun and the Slurm commands (agents/slurm_cli.py), as descriptors for the
        sandbox to copy, where `tool_dirs` has none: made once (sealed), reopened for
        each sandbox, since bubblewrap reads each to its end."""
        if self.credential is None or self.tool_dirs():
            return []
        with self._lock:
            if self._tools is None:
                self._tools = [
                    (data_fd(content, Path(path).name, sealed=True), path)
                    for content, path in slurm_cli.sandbox_files()
                ]
            tools = self._tools
        return [(reopen(fd), path) for fd, path in tools]

    def tool_links(self) -> list[tuple[str, str]]:
        """The commands' links to their dispatcher (`tool_files`), on the job's PATH."""
        if self.credential is None or self.tool_dirs():
            return []
        return slurm_cli.sandbox_links(TOOLS_DIR)

    def step_token(self, request: LaunchRequest) -> str:
        key = self.credential.key if self.credential is not None else None
        if key is None:
            return ""
        return signatures.step_token(key, self.node, request.job_id, request.attempt)

    # -- starting -------------------------------------------------------------------

    def _jobdir(self, job_id: int, attempt: int) -> Path:
        return self._jobs_dir / f"{job_id}.{attempt}"

    def _claim(self, jobdir: Path, request: LaunchRequest) -> bool:
        """Create the job's directory; False when this very launch already made it.

        The directory outlives the agent, so a launch re-sent after an agent restart is
        still recognised. A directory left by a different job with the same id (the
        controller's state was wiped, ids start again) is moved aside, not trusted.
        """
        for _ in range(3):
            try:
                jobdir.mkdir(mode=0o700)
            except FileNotFoundError:
                # The spool's first launch: its jobs directory is made then, not checked
                # for on every launch.
                self._jobs_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
                continue
            except FileExistsError:
                if _same_launch(jobdir, request):
                    return False
                aside = jobdir.with_name(f"{jobdir.name}.stale-{os.getpid()}-{id(request)}")
                log.warning("moving %s aside: it belongs to another job", jobdir)
                with contextlib.suppress(FileNotFoundError):
                    jobdir.rename(aside)
                continue
            payload = {
                "job_id": request.job_id,
                "attempt": request.attempt,
                "node": request.node,
                "cluster_name": request.cluster_name,
                "job": dict(request.job),
            }
            jobrecord.claim(jobdir, payload)
            return True
        raise LaunchError(f"cannot claim {jobdir}")

    def _start(self, entry: _Job, jobdir: Path) -> None:
        request = entry.request
        try:
            identity, files = self._place(request)
            process = self._spawn(request, jobdir, identity, files)
        except LaunchError as exc:
            self._fail(entry, jobdir, str(exc))
            return
        entry.process, entry.pid = process, process.init_pid
        # Written once the job is under way: none of it is on the path to its start.
        record = {
            **files.to_dict(),
            "uid": identity.uid,
            "account": identity.name,
            "processes": process.pid_file(),
        }
        try:
            jobrecord.append(jobdir, run=record)
        except OSError as exc:
            log.warning("cannot record where job %s.%s runs: %s", *request.key, exc)
        log.info(
            "job %s.%s started as %s, pid %d, in %s (cmd %s)",
            *request.key,
            identity.name,
            process.init_pid,
            files.run_dir,
            request.cmd_id,
        )
        self._waiters.submit(self._wait_for, entry, jobdir, files)

    def _place(self, request: LaunchRequest) -> tuple[Identity, JobFiles]:
        """Who the job runs as, and where it runs and writes (refusals fail the job)."""
        job, spec = request.job, request.spec
        try:
            identity = self.identities.for_job(tenant=spec.tenant, user=spec.user)
            workspace = self.workspaces.ensure(
                spec.tenant, identity, shared=self.identities.mode == "site"
            )
            files = job_files(
                workspace=workspace,
                job_id=request.job_id,
                workdir=spec.workdir,
                submit_dir=spec.submit_dir,
                stdout=str(job.get("stdout") or spec.stdout or DEFAULT_OUTPUT),
                stderr=str(job.get("stderr", spec.stderr) or ""),
                stdin=spec.stdin,
                expand=functools.partial(self._expand, request),
            )
        except (IdentityRefused, WorkspaceRefused) as exc:
            raise LaunchError(str(exc)) from exc
        return identity, files

    def _expand(self, request: LaunchRequest, pattern: str) -> str:
        array_job = request.job.get("array_job_id")
        array_task = request.job.get("array_task_id")
        return expand_output(
            pattern,
            job_id=request.job_id,
            # A name or user expanded into a path never adds a component of its own.
            name=safe_component(str(request.job.get("name") or request.spec.name)),
            user=safe_component(str(request.job.get("user") or request.spec.user)),
            node=self.node,
            array_job_id=int(array_job) if array_job is not None else None,
            array_task_id=int(array_task) if array_task is not None else None,
        )

    def _spawn(
        self, request: LaunchRequest, jobdir: Path, identity: Identity, files: JobFiles
    ) -> JobProcess:
        # Kept in the spool as launch.json holds it; the sandbox gets a read-only copy.
        script = _check_script(request.spec.script).encode()
        allocation: Mapping[str, Any] = (request.job.get("allocation") or {}).get(self.node) or {}
        limits = JobLimits.of(allocation, pids_max=self.pids_max, usable_cpus=self._usable_cpus)
        nodes = device_nodes(self._cdi, allocation.get("gpus", ()))
        # A simulated node's GPUs have no device nodes on the machine that plays it.
        devices = [DeviceNode(host, path) for host, path in nodes if os.path.exists(host)]
        command = [
            "/bin/sh",
            "-c",
            first_shell(self.limits.shell(limits)),
            "spurd-job",
            files.run_dir,
            "1" if files.make_run_dir else "",
            files.stdin,
            files.stdout,
            files.stderr,
            SCRIPT_PATH,
            *request.spec.argv,
        ]
        name = jobdir.name

        def prepare(init_pid: int) -> None:
            if limits.cpus:
                os.sched_setaffinity(init_pid, limits.cpus)
            self.limits.attach(name, init_pid, limits)

        # As itself (personal mode), or as the job's identity with the groups it needs
        # for its devices.
        own = (identity.uid, identity.gid) == (os.geteuid(), os.getegid())
        groups = list(dict.fromkeys([*identity.groups, *device_groups(devices, identity)]))
        as_whom = None if own else (identity.uid, identity.gid, groups)

        # The job's own run directory, made as its identity before its sandbox starts
        # (the first shell makes it only when that could not be done).
        make = None
        if files.make_run_dir:
            relative = os.path.relpath(files.run_dir, files.workspace)
            make = (files.workspace, relative.split(os.sep))

        def spawn(argv: list[str], fds: dict[int, int]) -> Supervised:
            return self._supervisor.spawn(
                directory=jobdir, argv=argv, identity=as_whom, fds=fds, make=make
            )

        try:
            return JobProcess.start(
                self.sandbox,
                identity=identity,
                workspace=files.workspace,
                command=command,
                env=self._environment(request, identity, files, constrained=bool(devices)),
                script=script,
                devices=devices,
                prepare=prepare,
                spawn=spawn,
                files=self.tool_files(),
                links=self.tool_links(),
                dirs=self.tool_dirs(),
            )
        except SandboxError as exc:
            self.limits.release(name)
            raise LaunchError(str(exc)) from exc

    def _environment(
        self,
        request: LaunchRequest,
        identity: Identity,
        files: JobFiles,
        *,
        constrained: bool,
        base: Mapping[str, str] | None = None,
    ) -> dict[str, str]:
        """`constrained`: the job's /dev holds its own GPUs' nodes only, so the runtimes
        find those GPUs alone and number them from 0, as in a CDI container (Slurm's
        ConstrainDevices does the same); the visible-device lists must count so too."""
        env = request.spec.env if base is None else dict(base)
        env.update(
            job_environment(
                request.job,
                self.node,
                cluster_name=request.cluster_name or self.cluster_name,
                submit_host=request.spec.submit_host,
                gpu_vendor=self.gpu_vendor,
                container=constrained,
            )
        )
        env["SLURM_JOB_UID"] = str(identity.uid)
        env["SLURM_JOB_GID"] = str(identity.gid)
        env["USER"] = env["LOGNAME"] = identity.name
        # A job submitted through the API may carry no environment at all.
        env.setdefault("PATH", DEFAULT_PATH)
        # The submitter's home and temporary directory are another machine's: here they
        # are the workspace (a site account's own home, in site tenancy) and the
        # sandbox's private /tmp.
        if self.identities.mode == "site" and identity.home:
            env.setdefault("HOME", identity.home)
        else:
            env["HOME"] = files.workspace
        env["TMPDIR"] = "/tmp"
        token = self.step_token(request)
        if token:
            # srun inside the job: its step credential (this job attempt's, nothing
            # else's) and where to create steps; the step client is on its PATH.
            env["SPUR_STEP_TOKEN"] = token
            env["SPUR_STEP_URL"] = ",".join(self.controllers)
            env["PATH"] = f"{TOOLS_DIR}:{env['PATH']}"
        else:
            env.pop("SPUR_STEP_TOKEN", None)
        return env

    def _fail(self, entry: _Job, jobdir: Path, reason: str) -> None:
        request = entry.request
        log.error("job %s.%s failed to launch: %s", *request.key, reason)
        # Kept in the spool, never written into the tenant's files as root: the output
        # route serves it in place of an output file that never came to be.
        with contextlib.suppress(OSError), open(jobdir / "launch-error", "a") as f:
            f.write(f"spurd: error: job {request.job_id}: {reason}\n")
        self._finish(entry, jobdir, exit_code=1, signal=0, reason=reason)

    # -- ending ---------------------------------------------------------------------

    def _wait_for(self, entry: _Job, jobdir: Path, files: JobFiles) -> None:
        process, request = entry.process, entry.request
        assert process is not None
        if not process.wait_ready():
            reason = process.errors()
            process.reap()
            self.limits.release(jobdir.name)
            self._fail(entry, jobdir, f"the job could not start: {reason}")
            return
        self._reporter.report(
            JobReport(
                "started",
                request.job_id,
                request.attempt,
                self.node,
                pid=process.init_pid,
                limits=self.limits.kind,
            )
        )
        process.wait_monitor()
        # Like slurmstepd: the job ends with its script; what it left running dies.
        returncode = process.reap()
        if returncode is None:
            self.limits.release(jobdir.name)
            log.error("job %s.%s: %s", *request.key, _SUPERVISOR_LOST)
            self._finish(entry, jobdir, exit_code=1, signal=0, reason=_SUPERVISOR_LOST)
            return
        exit_code, signum = decode_status(returncode, process.delivered)
        # A job ended by a signal this agent sent (a cancel, a time limit) did not fail.
        failed = (exit_code, signum) != (0, 0) and signum not in process.delivered
        oom = self.limits.out_of_memory(
            jobdir.name, failed=failed, error_tail=lambda: _error_tail(files)
        )
        self.limits.release(jobdir.name)
        reason = OUT_OF_MEMORY if oom else ""
        if jobrecord.fenced(jobdir):
            exit_code, signum, reason = 0, int(signals.SIGKILL), FENCED
        log.info("job %s.%s ended: %d:%d%s", *request.key, exit_code, signum, " (OOM)" * oom)
        self._finish(entry, jobdir, exit_code=exit_code, signal=signum, reason=reason, oom=oom)

    def _finish(
        self,
        entry: _Job,
        jobdir: Path,
        *,
        exit_code: int,
        signal: int,
        reason: str,
        oom: bool = False,
    ) -> None:
        request = entry.request
        # Like slurmstepd: the job's steps on this node end with it.
        self.steps.signal(request.job_id, request.attempt, signals.SIGKILL)
        entry.exit_code, entry.signal, entry.reason = exit_code, signal, reason
        # The report first (a durable reporter keeps it in the outbox), then the mark that
        # it was made: an agent that dies in between reports the end again, which the
        # controller takes as the duplicate it is.
        self._reporter.report(
            JobReport(
                "finished",
                request.job_id,
                request.attempt,
                self.node,
                exit_code=exit_code,
                signal=signal,
                reason=reason,
                oom=oom,
            )
        )
        try:
            jobrecord.append(jobdir, exit=[exit_code, signal])
        except OSError as exc:
            log.warning("cannot record the end of job %s.%s: %s", *request.key, exc)
        entry.finished.set()

    def _escalate(self, entry: _Job) -> None:
        if entry.process is not None and not entry.finished.is_set():
            log.info("job %s.%s still running: SIGKILL", *entry.request.key)
            self.limits.freeze(self._jobdir(*entry.request.key).name, False)
            if entry.process.kill():
                _record_signal(self._jobdir(*entry.request.key), signals.SIGKILL)


class _Waiters:
    """Threads that wait on jobs, each kept for the next job once its own has ended:
    starting a thread costs the launch that starts it a few milliseconds (it waits for
    the new thread to run), on the path to the job's start. Daemons, like the jobs'
    waiters before them: an agent that stops leaves its jobs running."""

    def __init__(self) -> None:
        self._tasks: queue.SimpleQueue[tuple[Callable[..., None], tuple[Any, ...]]] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()
        self._idle = 0

    def submit(self, task: Callable[..., None], *args: Any) -> None:
        with self._lock:
            spawn = self._idle == 0
            if not spawn:
                self._idle -= 1
        self._tasks.put((task, args))
        if spawn:
            threading.Thread(target=self._work, name="spurd-waiter", daemon=True).start()

    def _work(self) -> None:
        while True:
            task, args = self._tasks.get()
            try:
                task(*args)
            except Exception:
                log.exception("a job's waiter failed")
            with self._lock:
                self._idle += 1


def _check_script(script: str) -> str:
    """The script, if the sandbox can execute it; it runs as its own #! line says."""
    if not script.startswith("#!"):
        raise LaunchError("cannot execute the batch script: not an executable script (no #! line)")
    words = script[2:].split("\n", 1)[0].split()
    if not words or (os.path.isabs(words[0]) and not os.path.exists(words[0])):
        shown = words[0] if words else "(none)"
        raise LaunchError(f"cannot execute the batch script: no interpreter {shown}")
    return script


def _error_tail(files: JobFiles) -> bytes:
    path = files.stderr or files.stdout
    if path == DEV_NULL:
        return b""
    return read_tail(open_beneath(files.workspace, path))


def _same_launch(jobdir: Path, request: LaunchRequest) -> bool:
    earlier = jobrecord.read(jobdir).launch
    if earlier is None:
        # Claimed but never described: an agent died mid-launch, before anything ran
        # (launches of one pair inside one agent are serialised by its lock).
        return False
    job = earlier.get("job", {}) if isinstance(earlier, dict) else {}
    return bool(job.get("submit_time") == request.job.get("submit_time"))


def _record_signal(jobdir: Path, signum: int) -> None:
    """Note that the agent delivered `signum` to the job (for any later agent)."""
    try:
        jobrecord.append(jobdir, signal=int(signum))
    except OSError as exc:
        log.warning("cannot record signal %d in %s: %s", signum, jobdir, exc)


def _wait_supervisor(pid_text: str, timeout: float = _STATUS_S) -> None:
    """Until the monitor named in a pid file (`JobProcess.pid_file`) is gone."""
    try:
        _, _, pid, start = (int(v) for v in pid_text.split())
    except ValueError:
        return
    deadline = time.monotonic() + timeout
    while still_running(pid, start) and time.monotonic() < deadline:
        time.sleep(0.01)


def _ended_status(jobdir: Path, timeout: float = _STATUS_S) -> int | None:
    """The status of a job whose monitor is gone: its supervisor writes it right after
    (None: it never will, it died first)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = jobrecord.read(jobdir, launch=False)
        if record.status is not None or record.running is None:
            return record.status  # or no supervisor that said the job ran: never
        time.sleep(0.01)
    return None
