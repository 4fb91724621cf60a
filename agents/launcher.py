"""Runs batch jobs as real processes and tells the controller when they start and end.

Threads, not asyncio: every job needs a blocking `waitpid`, the API (Starlette, async)
calls `launch` through its thread pool, the heartbeat loop and the report sender are
threads too, and a plain `subprocess.Popen` keeps the launcher usable (and testable)
without an event loop. A node runs tens of jobs at once, not thousands, so one waiter
thread per job costs nothing that matters.

Layout of the spool directory, one directory per `(job_id, attempt)`:

    <spool>/jobs/<id>.<attempt>/launch.json   the payload, to recognise a re-sent launch
                               /script        the batch script, mode 0700
                               /pid           "<pid> <start time>" once started
                               /exit          "<exit_code> <signal>" once ended
                               /work/         the working directory when the job's
                                              own (--chdir) does not exist on this node
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import pwd
import signal as signals
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from agents.reports import Reporter
from scheduler.client import JobReport
from scheduler.core.contract import JobSpec
from scheduler.core.errors import InvalidSpec
from scheduler.slurm.filenames import expand_output
from scheduler.slurm.jobenv import job_environment

log = logging.getLogger(__name__)

DEFAULT_OUTPUT = "slurm-%j.out"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Signals that end a job: a stopped (suspended) job only acts on them once continued.
_ENDING = frozenset({signals.SIGTERM, signals.SIGINT, signals.SIGHUP, signals.SIGQUIT})


_LOST_STATUS = "spurd restarted while the job ran: its exit status is unknown"


class InvalidLaunch(ValueError):
    """A launch payload that can never be run as sent (the API answers 400)."""


class LaunchError(Exception):
    """The job could not be started on this node; it ends with exit code 1."""


@dataclass(frozen=True)
class LaunchRequest:
    job_id: int
    attempt: int
    node: str
    cluster_name: str
    job: Mapping[str, Any]
    spec: JobSpec
    cmd_id: str = ""  # the controller command that caused the launch (for the logs)

    @property
    def key(self) -> tuple[int, int]:
        return (self.job_id, self.attempt)

    @property
    def first_node(self) -> str:
        return str(self.job["nodes"][0])

    @classmethod
    def from_payload(cls, payload: Any) -> LaunchRequest:
        if not isinstance(payload, dict):
            raise InvalidLaunch("the launch payload must be a JSON object")
        job_id = _int(payload, "job_id")
        attempt = _int(payload, "attempt")
        node = payload.get("node")
        if not isinstance(node, str) or not node:
            raise InvalidLaunch("node must be a non-empty string")
        cluster_name = payload.get("cluster_name", "")
        if not isinstance(cluster_name, str):
            raise InvalidLaunch("cluster_name must be a string")
        job = payload.get("job")
        if not isinstance(job, dict):
            raise InvalidLaunch("job must be an object")
        if job.get("job_id", job_id) != job_id:
            raise InvalidLaunch("job.job_id does not match job_id")
        nodes = job.get("nodes")
        if not isinstance(nodes, list) or not nodes or not all(isinstance(n, str) for n in nodes):
            raise InvalidLaunch("job.nodes must be a non-empty list of node names")
        if node not in nodes:
            raise InvalidLaunch(f"node {node} is not one of the job's nodes")
        if "spec" not in job:
            raise InvalidLaunch("job.spec is missing")
        try:
            spec = JobSpec.from_dict(job["spec"])
        except InvalidSpec as exc:
            raise InvalidLaunch(f"job.spec: {exc}") from exc
        cmd_id = payload.get("cmd_id", "")
        if not isinstance(cmd_id, str) or len(cmd_id) > 200:
            raise InvalidLaunch("cmd_id must be a string of at most 200 characters")
        return cls(job_id, attempt, node, cluster_name, job, spec, cmd_id)


def _int(payload: Mapping[str, Any], key: str) -> int:
    value = payload.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidLaunch(f"{key} must be a non-negative integer")
    return value


@dataclass
class _Job:
    request: LaunchRequest
    pid: int | None = None
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
        cluster_name: str = "spur",
        gpu_vendor: str = "",
    ) -> None:
        self.node = node
        self.cluster_name = cluster_name
        self.gpu_vendor = gpu_vendor
        self._jobs_dir = Path(spool_dir) / "jobs"
        self._reporter = reporter
        self._lock = threading.Lock()
        self._jobs: dict[tuple[int, int], _Job] = {}

    # -- the API's operations -------------------------------------------------------

    def launch(self, request: LaunchRequest) -> bool:
        """Start the batch step if this node is the job's first; True for a duplicate."""
        if request.node != self.node:
            raise InvalidLaunch(f"launch for node {request.node} sent to node {self.node}")
        entry = _Job(request)
        with self._lock:
            if request.key in self._jobs:
                return True
            self._jobs[request.key] = entry
        if request.first_node != self.node:
            # The batch script runs once, on the first node; `srun` reaches the others.
            entry.finished.set()
            return False
        jobdir = self._jobs_dir / f"{request.job_id}.{request.attempt}"
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
        """Signal the job's process group; False when it does not run here."""
        with self._lock:
            entry = self._jobs.get((job_id, attempt))
        if entry is None or entry.pid is None or entry.finished.is_set():
            return False
        if not self._killpg(entry.pid, signum):
            return False
        if signum in _ENDING:
            self._killpg(entry.pid, signals.SIGCONT)
        if kill_after_s is not None:
            timer = threading.Timer(max(kill_after_s, 0.0), self._escalate, args=(entry,))
            timer.daemon = True
            timer.start()
        log.info("job %s.%s: signal %d delivered", job_id, attempt, signum)
        return True

    def running(self) -> list[dict[str, int]]:
        with self._lock:
            entries = list(self._jobs.values())
        return [
            {"job_id": e.request.job_id, "attempt": e.request.attempt, "pid": e.pid}
            for e in entries
            if e.pid is not None and not e.finished.is_set()
        ]

    def wait(self, job_id: int, attempt: int, timeout: float | None = None) -> bool:
        """Block until the job has ended here (and its report is queued)."""
        with self._lock:
            entry = self._jobs.get((job_id, attempt))
        return entry is not None and entry.finished.wait(timeout)

    def recover(self, *, poll_s: float = 1.0) -> list[tuple[int, int]]:
        """Adopt the jobs an earlier run of this agent started and that still run;
        report those that ended while no agent watched.

        Called once at start-up, before the first heartbeat, so the controller hears
        that they run instead of failing them. They are not our children any more, so
        their exit status is lost: when one ends it is reported as exit code 1 with a
        reason that says so (a false failure can be re-run; a false success would
        release `afterok` dependents on work that may have failed).
        """
        adopted = []
        for jobdir in sorted(self._jobs_dir.glob("*.*")) if self._jobs_dir.is_dir() else []:
            job_id, _, attempt = jobdir.name.partition(".")
            if not (job_id.isdigit() and attempt.isdigit()) or (jobdir / "exit").exists():
                continue
            try:
                pid_text, start_text = (jobdir / "pid").read_text().split()
                launch = json.loads((jobdir / "launch.json").read_text())
                request = LaunchRequest.from_payload(launch)
            except (OSError, ValueError):
                continue
            pid = int(pid_text)
            entry = _Job(request, pid=pid)
            with self._lock:
                if request.key in self._jobs:
                    continue
                self._jobs[request.key] = entry
            if not still_running(pid, int(start_text)):
                # It ended (and its pid may be someone else's now) while we were away.
                self._finish(entry, jobdir, exit_code=1, signal=0, reason=_LOST_STATUS)
                continue
            threading.Thread(
                target=self._watch_adopted,
                args=(entry, jobdir, int(start_text), poll_s),
                name=f"spurd-adopted-{request.job_id}.{request.attempt}",
                daemon=True,
            ).start()
            log.info("job %s.%s (pid %d) still runs: adopted", *request.key, pid)
            adopted.append(request.key)
        return adopted

    def _watch_adopted(self, entry: _Job, jobdir: Path, start_time: int, poll_s: float) -> None:
        assert entry.pid is not None
        while still_running(entry.pid, start_time):
            time.sleep(poll_s)
        self._finish(entry, jobdir, exit_code=1, signal=0, reason=_LOST_STATUS)

    def kill_all(self, *, timeout: float = 5.0) -> None:
        """SIGKILL every job of this agent and wait for their ends to be reported."""
        for job in self.running():
            self.signal(job["job_id"], job["attempt"], signals.SIGKILL)
        for job in self.running():
            self.wait(job["job_id"], job["attempt"], timeout)

    # -- starting -------------------------------------------------------------------

    def _claim(self, jobdir: Path, request: LaunchRequest) -> bool:
        """Create the job's directory; False when this very launch already made it.

        The directory outlives the agent, so a launch re-sent after an agent restart is
        still recognised. A directory left by a different job with the same id (the
        controller's state was wiped, ids start again) is moved aside, not trusted.
        """
        self._jobs_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            try:
                jobdir.mkdir()
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
            _write_atomic(jobdir / "launch.json", json.dumps(payload, indent=1))
            return True
        raise LaunchError(f"cannot claim {jobdir}")

    def _start(self, entry: _Job, jobdir: Path) -> None:
        request = entry.request
        output: Path | None = None
        try:
            workdir = _workdir(request, jobdir)
            output, error = self._output_paths(request, workdir)
            proc = self._spawn(request, jobdir, workdir, output, error)
        except LaunchError as exc:
            self._fail(entry, jobdir, output, str(exc))
            return
        entry.pid = proc.pid
        _write_atomic(jobdir / "pid", f"{proc.pid} {process_start_time(proc.pid)}\n")
        log.info(
            "job %s.%s started, pid %d, in %s (cmd %s)",
            *request.key,
            proc.pid,
            workdir,
            request.cmd_id,
        )
        self._reporter.report(
            JobReport("started", request.job_id, request.attempt, self.node, pid=proc.pid)
        )
        waiter = threading.Thread(
            target=self._wait_for,
            args=(entry, proc, jobdir),
            name=f"spurd-job-{request.job_id}.{request.attempt}",
            daemon=True,
        )
        waiter.start()

    def _output_paths(self, request: LaunchRequest, workdir: Path) -> tuple[Path, Path | None]:
        job, spec = request.job, request.spec
        out_pattern = str(job.get("stdout") or spec.stdout or DEFAULT_OUTPUT)
        err_pattern = str(job.get("stderr", spec.stderr) or "")
        output = self._expand(out_pattern, request, workdir)
        error = self._expand(err_pattern, request, workdir) if err_pattern else None
        return output, (None if error == output else error)

    def _expand(self, pattern: str, request: LaunchRequest, workdir: Path) -> Path:
        name = str(request.job.get("name") or request.spec.name)
        user = str(request.job.get("user") or request.spec.user)
        array_job = request.job.get("array_job_id")
        array_task = request.job.get("array_task_id")
        expanded = expand_output(
            pattern,
            job_id=request.job_id,
            name=name,
            user=user,
            node=self.node,
            array_job_id=int(array_job) if array_job is not None else None,
            array_task_id=int(array_task) if array_task is not None else None,
        )
        return workdir / expanded  # an absolute pattern replaces workdir

    def _spawn(
        self,
        request: LaunchRequest,
        jobdir: Path,
        workdir: Path,
        output: Path,
        error: Path | None,
    ) -> subprocess.Popen[bytes]:
        script = jobdir / "script"
        try:
            fd = os.open(script, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o700)
            with os.fdopen(fd, "wb") as f:
                f.write(request.spec.script.encode())
            os.chmod(script, 0o700)  # O_CREAT's mode is filtered by the umask
        except OSError as exc:
            raise LaunchError(f"cannot write the batch script: {exc.strerror}") from exc
        opened: list[IO[bytes]] = []
        try:
            stdout = _open(output, "ab", opened)
            stderr: IO[bytes] | int = _open(error, "ab", opened) if error else subprocess.STDOUT
            stdin: IO[bytes] | int = subprocess.DEVNULL
            if request.spec.stdin:
                stdin = _open(self._expand(request.spec.stdin, request, workdir), "rb", opened)
            try:
                return subprocess.Popen(
                    [str(script), *request.spec.argv],
                    cwd=workdir,
                    env=self._environment(request),
                    stdin=stdin,
                    stdout=stdout,
                    stderr=stderr,
                    close_fds=True,
                    # Its own process group: signals and the final cleanup reach every
                    # process the script starts, not only the script.
                    start_new_session=True,
                )
            except OSError as exc:
                reason = exc.strerror or str(exc)
                if exc.errno == errno.ENOEXEC:
                    reason = "not an executable script (no #! line?)"
                raise LaunchError(f"cannot execute the batch script: {reason}") from exc
        finally:
            for handle in opened:  # the child holds its own copies
                handle.close()

    def _environment(self, request: LaunchRequest) -> dict[str, str]:
        env = request.spec.env
        env.update(
            job_environment(
                request.job,
                self.node,
                cluster_name=request.cluster_name or self.cluster_name,
                submit_host=request.spec.submit_host,
                gpu_vendor=self.gpu_vendor,
            )
        )
        env["SLURM_JOB_UID"] = str(os.getuid())
        env["SLURM_JOB_GID"] = str(os.getgid())
        # A job submitted through the API may carry no environment at all.
        env.setdefault("PATH", DEFAULT_PATH)
        if "HOME" not in env:
            with contextlib.suppress(KeyError):
                env["HOME"] = pwd.getpwuid(os.getuid()).pw_dir
        return env

    def _fail(self, entry: _Job, jobdir: Path, output: Path | None, reason: str) -> None:
        request = entry.request
        log.error("job %s.%s failed to launch: %s", *request.key, reason)
        message = f"spurd: error: job {request.job_id}: {reason}\n"
        for target in (output, jobdir / "launch-error"):
            if target is None:
                continue
            try:
                with open(target, "a") as f:
                    f.write(message)
                break
            except OSError:
                continue
        self._finish(entry, jobdir, exit_code=1, signal=0, reason=reason)

    # -- ending ---------------------------------------------------------------------

    def _wait_for(self, entry: _Job, proc: subprocess.Popen[bytes], jobdir: Path) -> None:
        # Wait without reaping: while the script is a zombie its pid cannot be
        # reused, so killing its process group below cannot hit a stranger.
        with contextlib.suppress(ChildProcessError):
            os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        # Like slurmstepd: the job ends with its script; what it left running dies.
        self._killpg(proc.pid, signals.SIGKILL)
        returncode = proc.wait()
        if returncode < 0:
            exit_code, signum = 0, -returncode
        else:
            exit_code, signum = returncode, 0
        log.info("job %s.%s ended: %d:%d", *entry.request.key, exit_code, signum)
        self._finish(entry, jobdir, exit_code=exit_code, signal=signum, reason="")

    def _finish(
        self, entry: _Job, jobdir: Path, *, exit_code: int, signal: int, reason: str
    ) -> None:
        request = entry.request
        entry.exit_code, entry.signal, entry.reason = exit_code, signal, reason
        try:
            _write_atomic(jobdir / "exit", f"{exit_code} {signal}\n")
        except OSError as exc:
            log.warning("cannot record the end of job %s.%s: %s", *request.key, exc)
        self._reporter.report(
            JobReport(
                "finished",
                request.job_id,
                request.attempt,
                self.node,
                exit_code=exit_code,
                signal=signal,
                reason=reason,
            )
        )
        entry.finished.set()

    def _escalate(self, entry: _Job) -> None:
        if entry.pid is not None and not entry.finished.is_set():
            log.info("job %s.%s still running: SIGKILL", *entry.request.key)
            self._killpg(entry.pid, signals.SIGKILL)

    @staticmethod
    def _killpg(pgid: int, signum: int) -> bool:
        try:
            os.killpg(pgid, signum)
        except (ProcessLookupError, PermissionError):
            return False
        return True


def process_start_time(pid: int) -> int:
    """The process's start time in clock ticks since boot (-1 if there is no such pid).

    With the pid it names one process for the life of the machine: a recycled pid has
    a different start time. A zombie keeps its start time.
    """
    stat = _proc_stat(pid)
    return -1 if stat is None else stat[1]


def still_running(pid: int, start_time: int) -> bool:
    """Whether the process started at `start_time` as `pid` runs (and is no zombie)."""
    stat = _proc_stat(pid)
    return stat is not None and stat[1] == start_time and stat[0] not in ("Z", "X")


def _proc_stat(pid: int) -> tuple[str, int] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: split after the last ')'.
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], int(fields[19])


def _workdir(request: LaunchRequest, jobdir: Path) -> Path:
    """The job's --chdir when this node has it, else a directory of its own."""
    requested = str(request.job.get("workdir") or request.spec.workdir or "")
    path = Path(requested)
    if requested and path.is_absolute() and os.path.lexists(path):
        if not path.is_dir():
            raise LaunchError(f"working directory {path} is not a directory")
        if not os.access(path, os.X_OK):
            raise LaunchError(f"working directory {path} is not accessible")
        return path
    work = jobdir / "work"
    try:
        work.mkdir(exist_ok=True)
    except OSError as exc:
        raise LaunchError(f"cannot create the job directory {work}: {exc.strerror}") from exc
    return work


def _open(path: Path, mode: str, opened: list[IO[bytes]]) -> IO[bytes]:
    try:
        f: IO[bytes] = open(path, mode)  # noqa: SIM115 - closed by the caller after the fork
    except OSError as exc:
        raise LaunchError(f"cannot open {path}: {exc.strerror}") from exc
    opened.append(f)
    return f


def _same_launch(jobdir: Path, request: LaunchRequest) -> bool:
    try:
        earlier = json.loads((jobdir / "launch.json").read_text())
    except (OSError, ValueError):
        # Claimed but never described: an agent died mid-launch, before anything ran
        # (launches of one pair inside one agent are serialised by its lock).
        return False
    job = earlier.get("job", {}) if isinstance(earlier, dict) else {}
    return bool(job.get("submit_time") == request.job.get("submit_time"))


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
