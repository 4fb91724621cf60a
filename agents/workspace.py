"""The organisations' files on a node, and where in them a job runs, reads and writes.

    {work_root}/                      root's, 0711: every job can pass through, none can list
    {work_root}/{tenant}/             the organisation's workspace: its identity's, 0700
                                      (0770 in site tenancy, where several accounts share it)
    {work_root}/{tenant}/jobs/{id}/   the run directory of a job that named none in it

A job runs in its `workdir` (--chdir) when it gives one, which must lie inside the
workspace once symlinks are resolved (else the job fails, saying why); else in the
directory sbatch ran in when that lies inside the workspace; else in a directory of its
own there. Its output, error and input files are taken relative to that run directory,
and must lie inside the workspace too (except /dev/null). A job name expanded by `%x`
never adds a path component.

These checks give a refused job its clear reason. They are not what stops a tenant:
the files are opened by the job's own identity inside its sandbox, where nothing of the
host but the workspace is writable and no other workspace exists, so the kernel refuses
what a symlink planted between this check and the job's start would try.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.identity import Identity, check_tenant

DEV_NULL = "/dev/null"


class WorkspaceRefused(Exception):
    """A working directory or file outside the workspace, or a workspace we cannot make."""


@dataclass(frozen=True)
class JobFiles:
    """Where a job runs and what its standard streams are, as absolute paths that are the
    same inside its sandbox (the workspace is mounted at its own path there)."""

    workspace: str
    run_dir: str
    # The job's own directory, made as the job's identity as it starts, in its sandbox
    # (agents/sandbox.py `SandboxJob.make_dir`).
    make_run_dir: bool
    stdin: str
    stdout: str
    stderr: str  # "": into stdout

    def to_dict(self) -> dict[str, Any]:
        # Not `asdict`, which deep-copies each field through a recursive walk: on every
        # launch's path, for six strings and a bool.
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobFiles:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


class Workspaces:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(os.path.abspath(root))

    def prepare(self) -> None:
        """Create the work root if missing (reachable by every job, listable by none)."""
        if not self.root.is_dir():
            self.root.mkdir(parents=True, mode=0o711)
            if os.geteuid() == 0:
                os.chmod(self.root, 0o711)  # mkdir's mode passed through the umask
        self.root = Path(os.path.realpath(self.root))

    def unreachable(self) -> str | None:
        """The first directory on the way to the work root that another user cannot pass
        through (a job's identity must, to have its workspace mounted), or None. One
        that does not exist yet does not count: `prepare` makes it passable."""
        path = Path(os.path.realpath(self.root))
        for directory in [*reversed(path.parents), path]:
            try:
                mode = directory.stat().st_mode
            except FileNotFoundError:
                return None
            except OSError:
                return str(directory)
            if not mode & stat.S_IXOTH:
                return str(directory)
        return None

    def ensure(self, tenant: str, identity: Identity, *, shared: bool = False) -> Path:
        """The tenant's workspace, made (or given back to its identity) if need be.

        The work root is root's, so nobody but this agent makes or replaces an entry in
        it; still, the entry is opened without following a symlink before it is changed.
        """
        check_tenant(tenant)
        try:
            root_fd = os.open(self.root, os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise WorkspaceRefused(f"the work root {self.root}: {exc.strerror}") from exc
        try:
            made = False
            with contextlib.suppress(FileExistsError):
                os.mkdir(tenant, 0o700, dir_fd=root_fd)
                made = True
            try:
                fd = os.open(tenant, os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root_fd)
            except OSError as exc:
                raise WorkspaceRefused(
                    f"the workspace {self.root / tenant} is not a directory: {exc.strerror}"
                ) from exc
        finally:
            os.close(root_fd)
        try:
            info = os.fstat(fd)
            mine = (identity.uid, identity.gid) == (os.geteuid(), os.getegid())
            # Site tenancy: the site may have made it, for a project group; leave it be.
            if (
                (made or not shared)
                and not mine
                and (info.st_uid, info.st_gid)
                != (
                    identity.uid,
                    identity.gid,
                )
            ):
                os.fchown(fd, identity.uid, identity.gid)
            mode = 0o770 if shared else 0o700
            if (made or not shared) and stat.S_IMODE(info.st_mode) != mode:
                os.fchmod(fd, mode)
        except OSError as exc:
            raise WorkspaceRefused(f"cannot prepare the workspace of {tenant}: {exc}") from exc
        finally:
            os.close(fd)
        return self.root / tenant


def safe_component(text: str) -> str:
    """`text` as one path component: no "/", and not "." or ".." (dots become "_")."""
    text = text.replace("/", "_").replace("\0", "_")
    if not text.strip("."):
        return "_" * len(text) or "_"
    return text


def inside(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> bool:
    """Whether `path`, symlinks resolved, is `root` or lies under it."""
    return _beneath(path, os.path.realpath(root)) is not None


def _beneath(path: str | os.PathLike[str], top: str) -> str | None:
    """`path` with its symlinks resolved, if that is `top` (resolved already) or lies
    under it; else None. Each resolution is an lstat a component: a launch resolves its
    paths once each, not once to check and again to use."""
    resolved = os.path.realpath(path)
    return resolved if resolved == top or resolved.startswith(top.rstrip("/") + "/") else None


def job_files(
    *,
    workspace: Path,
    job_id: int,
    workdir: str,
    submit_dir: str,
    stdout: str,
    stderr: str,
    stdin: str,
    expand: Callable[[str], str],
) -> JobFiles:
    """Where the job runs and its stream files (see the module docstring); raises
    WorkspaceRefused with the reason the job fails with."""
    ws = os.path.realpath(workspace)
    if workdir:
        wanted = workdir if os.path.isabs(workdir) else os.path.join(ws, workdir)
        resolved = _beneath(wanted, ws)
        if resolved is None:
            raise WorkspaceRefused(f"working directory {workdir} is outside the workspace {ws}")
        if not os.path.isdir(resolved):
            exists = os.path.lexists(wanted)
            raise WorkspaceRefused(
                f"working directory {workdir} "
                + ("is not a directory" if exists else "does not exist")
            )
        run_dir, make = resolved, False
    else:
        submitted = _beneath(submit_dir, ws) if submit_dir and os.path.isabs(submit_dir) else None
        if submitted is not None and os.path.isdir(submitted):
            run_dir, make = submitted, False
        else:
            run_dir, make = os.path.join(ws, "jobs", str(job_id)), True

    def place(kind: str, pattern: str) -> str:
        expanded = expand(pattern)
        if expanded == DEV_NULL:
            return DEV_NULL
        path = os.path.join(run_dir, expanded)  # an absolute one replaces run_dir
        resolved = _beneath(path, ws)
        if resolved is None:
            raise WorkspaceRefused(f"{kind} {expanded} is outside the workspace {ws}")
        return resolved

    out = place("output file", stdout)
    err = place("error file", stderr) if stderr else ""
    source = place("input file", stdin) if stdin else DEV_NULL
    if source != DEV_NULL and not os.path.isfile(source):
        raise WorkspaceRefused(f"input file {stdin} does not exist")
    return JobFiles(ws, run_dir, make, source, out, "" if err == out else err)


def open_beneath(root: str, path: str) -> int:
    """A read-only descriptor of the regular file `path` under `root`, reached without
    following any symlink on the way: what the agent reads on a tenant's behalf (their
    output files) must be a file of the workspace, never where a link planted by a job
    points. Raises OSError (FileNotFoundError, or ELOOP for a symlink)."""
    relative = os.path.relpath(path, root)
    parts = relative.split(os.sep)
    if relative == "." or parts[0] == "..":
        raise FileNotFoundError(path)
    fd = os.open(root, os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            step = os.open(part, os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = step
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        found = os.open(parts[-1], flags, dir_fd=fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(found).st_mode):
        os.close(found)
        raise FileNotFoundError(path)
    return found
