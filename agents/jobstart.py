"""How a job is started on this node: who it runs as and where it runs and writes
(`_place`), its environment (`_environment`), and the sandbox its batch script runs in
(`_spawn`); and the same for a job step's tasks (`place`, `environment`, the Slurm
commands' files, the step token: what agents/steps.py asks of the launcher).

A mixin of `Launcher` (its own methods, kept in their own file, as
scheduler/core/transitions.py is of `ClusterState`): the attributes it declares below
are all it reads of the launcher. agents/launcher.py decides the order of things.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agents import slurm_cli
from agents.cdi import device_nodes
from agents.credentials import NodeCredential
from agents.identity import Identities, Identity, IdentityRefused
from agents.jobprocess import JobProcess, SandboxError
from agents.launch_request import LaunchError, LaunchRequest
from agents.limits import Enforcement, JobLimits
from agents.sandbox import (
    DeviceNode,
    Sandbox,
    data_fd,
    device_groups,
    first_shell_command,
    in_first_shell,
    reopen,
)
from agents.steps import TOOLS_DIR
from agents.supervisor import JobSupervisor, Supervised
from agents.workspace import JobFiles, WorkspaceRefused, Workspaces, job_files, safe_component
from scheduler.rpc import signatures
from scheduler.slurm.filenames import expand_output
from scheduler.slurm.jobenv import job_environment

DEFAULT_OUTPUT = "slurm-%j.out"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
log = logging.getLogger("agents.launcher")  # the launcher's log, as before the split


class JobStarting:
    node: str
    cluster_name: str
    gpu_vendor: str
    controllers: Sequence[str]
    credential: NodeCredential | None
    identities: Identities
    workspaces: Workspaces
    sandbox: Sandbox
    limits: Enforcement
    pids_max: int
    _cdi: dict[str, Any]
    _usable_cpus: frozenset[int]
    _lock: threading.Lock
    _tools: list[tuple[int, str]] | None
    _tool_dirs: list[tuple[str, str]] | None
    _supervisor: JobSupervisor

    # -- what job steps need (agents/steps.py) ------------------------------------------

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

    # -- a job's batch step ---------------------------------------------------------------

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
        command = first_shell_command(
            self.limits.shell(limits),
            run_dir=files.run_dir,
            stdin=files.stdin,
            stdout=files.stdout,
            stderr=files.stderr,
            argv=request.spec.argv,
            in_shell=in_first_shell(request.spec.script),
        )
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

        def spawn(argv: list[str], fds: dict[int, int]) -> Supervised:
            return self._supervisor.spawn(directory=jobdir, argv=argv, identity=as_whom, fds=fds)

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
                # Made by bubblewrap, as the job's identity, in the job's view.
                make_dir=files.run_dir if files.make_run_dir else "",
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


def _check_script(script: str) -> str:
    """The script, if the sandbox can execute it; it runs as its own #! line says."""
    if not script.startswith("#!"):
        raise LaunchError("cannot execute the batch script: not an executable script (no #! line)")
    words = script[2:].split("\n", 1)[0].split()
    if not words or (os.path.isabs(words[0]) and not os.path.exists(words[0])):
        shown = words[0] if words else "(none)"
        raise LaunchError(f"cannot execute the batch script: no interpreter {shown}")
    return script
