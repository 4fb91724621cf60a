"""Where a job runs and writes inside its organisation's workspace, and how the agent
reads a tenant's files without following their links."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from agents.identity import Identity
from agents.workspace import (
    DEV_NULL,
    JobFiles,
    WorkspaceRefused,
    Workspaces,
    job_files,
    open_beneath,
    safe_component,
)


def files(ws: Path, **kw: str) -> JobFiles:
    args = {"workdir": "", "submit_dir": "", "stdout": "slurm-%j.out", "stderr": "", "stdin": ""}
    args.update(kw)
    return job_files(workspace=ws, job_id=7, expand=lambda p: p.replace("%j", "7"), **args)


def test_a_job_runs_in_its_workdir_then_its_submit_dir_then_its_own_directory(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "acme"
    (ws / "project").mkdir(parents=True)
    assert files(ws, workdir="project").run_dir == str(ws / "project")
    assert files(ws, workdir=str(ws / "project")).run_dir == str(ws / "project")
    assert files(ws, submit_dir=str(ws / "project")).run_dir == str(ws / "project")
    own = files(ws, submit_dir="/home/alice")
    assert (own.run_dir, own.make_run_dir) == (str(ws / "jobs" / "7"), True)
    assert own.stdout == str(ws / "jobs" / "7" / "slurm-7.out")
    assert (own.stdin, own.stderr) == (DEV_NULL, "")


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"workdir": "/root"}, "working directory /root is outside the workspace"),
        ({"workdir": "../other"}, "outside the workspace"),
        ({"workdir": "missing"}, "does not exist"),
        ({"stdout": "/etc/x"}, "output file /etc/x is outside the workspace"),
        ({"stdout": "../../../x"}, "outside the workspace"),
        ({"stderr": "/var/log/x"}, "error file /var/log/x is outside"),
        ({"stdin": "/etc/shadow"}, "input file /etc/shadow is outside"),
        ({"stdin": "absent.txt"}, "input file absent.txt does not exist"),
        ({"workdir": ".", "stdout": "link/x"}, "outside the workspace"),
    ],
)
def test_what_lies_outside_the_workspace_is_refused_with_a_reason(
    tmp_path: Path, kw: dict[str, str], message: str
) -> None:
    ws = tmp_path / "acme"
    ws.mkdir()
    (tmp_path / "other").mkdir()
    os.symlink("/etc", ws / "link")
    with pytest.raises(WorkspaceRefused, match=message):
        files(ws, **kw)


def test_dev_null_is_a_fine_output(tmp_path: Path) -> None:
    found = files(tmp_path, stdout=DEV_NULL, stderr=DEV_NULL)
    assert (found.stdout, found.stderr) == (DEV_NULL, "")


@pytest.mark.parametrize(
    "name, safe",
    [("train", "train"), ("../x", ".._x"), ("..", "__"), (".", "_"), ("a/b/c", "a_b_c"), ("", "_")],
)
def test_a_name_becomes_one_harmless_path_component(name: str, safe: str) -> None:
    assert safe_component(name) == safe


def test_a_workspace_is_made_private_to_its_identity(tmp_path: Path) -> None:
    workspaces = Workspaces(tmp_path / "work")
    workspaces.prepare()
    me = Identity("me", os.geteuid(), os.getegid())
    ws = workspaces.ensure("acme", me)
    assert ws == workspaces.root / "acme"
    assert stat.S_IMODE(ws.stat().st_mode) == 0o700
    assert stat.S_IMODE(workspaces.root.stat().st_mode) & 0o711 == 0o711
    os.symlink("/etc", workspaces.root / "evil")
    with pytest.raises(WorkspaceRefused):
        workspaces.ensure("evil", me)


def test_an_unreachable_work_root_is_named(tmp_path: Path) -> None:
    hidden = tmp_path / "private"
    hidden.mkdir(mode=0o700)
    workspaces = Workspaces(hidden / "work")
    workspaces.prepare()
    assert workspaces.unreachable() in (str(hidden), str(tmp_path), *map(str, tmp_path.parents))


def test_a_tenants_file_is_read_without_following_links(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "out").write_text("mine\n")
    os.symlink("/etc/passwd", tmp_path / "passwd")
    os.symlink("/etc", tmp_path / "etc")
    fd = open_beneath(str(tmp_path), str(tmp_path / "logs" / "out"))
    assert os.read(fd, 100) == b"mine\n"
    os.close(fd)
    for path in ("passwd", "etc/passwd", "logs", "../x"):
        with pytest.raises(OSError):
            open_beneath(str(tmp_path), str(tmp_path / path))


def test_links_are_judged_where_they_lead_and_the_paths_used_are_resolved(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "acme"
    (ws / "project" / "out").mkdir(parents=True)
    os.symlink(ws / "project", ws / "here")
    os.symlink(tmp_path, ws / "away")
    found = files(ws, submit_dir=str(ws / "here"), stdout="out/slurm-%j.out", stderr="e.txt")
    assert (found.run_dir, found.make_run_dir) == (str(ws / "project"), False)
    assert found.stdout == str(ws / "project" / "out" / "slurm-7.out")
    assert found.stderr == str(ws / "project" / "e.txt")
    # A submit directory that leads out of the workspace is not where the job runs.
    away = files(ws, submit_dir=str(ws / "away"))
    assert (away.run_dir, away.make_run_dir) == (str(ws / "jobs" / "7"), True)
    # A working directory that leads out of it fails the job.
    with pytest.raises(WorkspaceRefused, match="outside the workspace"):
        files(ws, workdir="away")
    (ws / "plain").write_text("")
    with pytest.raises(WorkspaceRefused, match="plain is not a directory"):
        files(ws, workdir="plain")


def test_a_jobs_files_read_back_as_they_were_recorded(tmp_path: Path) -> None:
    found = files(tmp_path, stderr="err-%j.txt")
    assert JobFiles.from_dict(found.to_dict()) == found
    assert found.to_dict()["stderr"] == str(tmp_path / "jobs" / "7" / "err-7.txt")
