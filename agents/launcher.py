"""Runs batch jobs, each contained, and tells the controller when they start and end.

Every job runs as an unprivileged identity (agents/identity.py) inside a sandbox
(agents/sandbox.py) that shows it its organisation's workspace (agents/workspace.py),
the host's system directories read-only, and the device nodes of its own GPUs, bound to
its CPUs and held to its memory and process limits (agents/limits.py). Its processes
are held through agents/jobprocess.py. This module decides the order of things and
keeps the spool; how a job is started (as whom, where, with what environment, in which
sandbox) is agents/jobstart.py, how its end is seen and reported agents/jobend.py: both
mixins of `Launcher`.

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
import logging
import os
import signal as signals
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents import jobrecord
from agents.cdi import read_cdi_spec
from agents.credentials import NodeCredential
from agents.identity import Identities
from agents.jobend import FENCED, JobEnding, _Waiters
from agents.jobprocess import JobProcess, decode_status, still_running
from agents.jobstart import JobStarting
from agents.launch_request import InvalidLaunch, LaunchError, LaunchRequest, StaleLaunch
from agents.limits import DEFAULT_PIDS_MAX, Enforcement
from agents.limits import detect as detect_limits
from agents.output import read_output
from agents.reports import Reporter
from agents.sandbox import Bubblewrap, Sandbox
from agents.steps import DETACH_GRACE_S, StepRunner
from agents.supervisor import JobSupervisor, Lease, renew, supervisors_of
from agents.workspace import Workspaces

log = logging.getLogger(__name__)

# Signals that end a job: a stopped (suspended) job only acts on them once continued.
_ENDING = frozenset({signals.SIGTERM, signals.SIGINT, signals.SIGHUP, signals.SIGQUIT})
# scontrol suspend and resume.
_SUSPENDING = frozenset({signals.SIGSTOP, signals.SIGCONT})

LAUNCH_CONCURRENCY = 8  # a batch's launches starting at once (each mostly waits on a spawn)

_INTERRUPTED_LAUNCH = "spurd restarted while launching the job: it was stopped"
_LOST_STATUS = "spurd restarted while the job ran: its exit status is unknown"
_STATUS_S = 5.0  # how long a job's status may take to be written once its monitor ended

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


class Launcher(JobStarting, JobEnding):
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

    # -- ending ---------------------------------------------------------------------

    def _escalate(self, entry: _Job) -> None:
        if entry.process is not None and not entry.finished.is_set():
            log.info("job %s.%s still running: SIGKILL", *entry.request.key)
            self.limits.freeze(self._jobdir(*entry.request.key).name, False)
            if entry.process.kill():
                _record_signal(self._jobdir(*entry.request.key), signals.SIGKILL)


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
