"""Where a job's files may lie: inside its organisation's workspace.

A job runs in its `workdir` when it names one, else in the directory it was submitted
from when that lies in the workspace, else in a directory of its own there
(`jobs/<id>/`). Its `stdout`, `stderr` and `stdin` patterns are taken relative to that
directory. Every one of them must stay inside the workspace (`/dev/null` aside).

`outside_workspace` checks this on the text alone (no file system): it is what the
submit edge runs, so that `"stdout": "/etc/x"`, `"workdir": "/root"` or `../../x` is
refused with a clear message before the job is queued. The agent checks again on the
node with symlinks resolved (agents/workspace.py), and the kernel has the last word:
the files are opened by the job's own identity inside its sandbox.
"""

from __future__ import annotations

import posixpath

from scheduler.core.contract.spec import JobSpec

DEV_NULL = "/dev/null"
# The run directory of a job that names none; its id is not known at submit, and no
# pattern's meaning depends on it (it is one path component either way).
_OWN_RUN_DIR = "jobs/0"


def inside(path: str, root: str) -> bool:
    """Whether the normalised absolute `path` is `root` or lies under it."""
    root = root.rstrip("/") or "/"
    return path == root or path.startswith(root.rstrip("/") + "/")


def outside_workspace(spec: JobSpec, workspace: str) -> tuple[str, str] | None:
    """The first of the spec's paths that leaves `workspace` (absolute), as
    (field, message), or None when all stay inside."""
    ws = posixpath.normpath(workspace)
    if spec.workdir:
        run_dir = posixpath.normpath(posixpath.join(ws, spec.workdir))
        if not inside(run_dir, ws):
            return "workdir", (
                f"working directory {spec.workdir} is outside your organisation's "
                f"workspace {ws}: give a path inside it, or one relative to it"
            )
    else:
        submitted = posixpath.normpath(spec.submit_dir) if spec.submit_dir else ""
        own = posixpath.join(ws, _OWN_RUN_DIR)
        run_dir = submitted if posixpath.isabs(submitted) and inside(submitted, ws) else own
    for field, what in (("stdout", "output"), ("stderr", "error"), ("stdin", "input")):
        pattern = getattr(spec, field)
        if not pattern or pattern == DEV_NULL:
            continue
        if not inside(posixpath.normpath(posixpath.join(run_dir, pattern)), ws):
            return field, (
                f"{what} file {pattern} is outside your organisation's workspace {ws} "
                f"(relative paths are taken from the job's working directory {run_dir})"
            )
    return None
