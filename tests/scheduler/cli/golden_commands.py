"""Runs a golden capture's command line as given (`squeue -o '%i %T %r'`, `scontrol show
job 16 | grep -E 'JobState|ExitCode'`, `sinfo --version; sbatch --version`) through our
commands, against the loopback web API of `fake_api` holding a scene that rebuilds the
captured cluster, with the clock stopped at the scene's moment.

A submission can be answered by a real scheduler state (`ClusterState` of the captured
cluster: partition `gpu`, gpu[01-04] with 64 CPUs, 512 GiB and 8 MI300X each), so that
sbatch prints what the controller would make it print. The job id it takes is the one
the capture shows: ids are normalised by construction.
"""

from __future__ import annotations

import io
import re
import shlex
from collections.abc import Callable
from datetime import datetime, tzinfo
from typing import Any

import pytest

from scheduler.cli import sacct, sacctmgr, sbatch, scancel, scontrol, sinfo, squeue, srun
from scheduler.core import commands as c
from scheduler.core.contract import JobSpec
from scheduler.core.errors import Rejected
from scheduler.core.state import ClusterState
from tests.scheduler.cli.fake_api import FakeApi
from tests.scheduler.core.factories import cluster, cmd_id, gpu_node
from tests.scheduler.slurm.golden import Capture, capture, captures
from tests.scheduler.slurm.scene import NOW

PROGRAMS: dict[str, Callable[[list[str]], int]] = {
    "sacct": sacct.main,
    "sacctmgr": sacctmgr.main,
    "sbatch": sbatch.main,
    "scancel": scancel.main,
    "scontrol": scontrol.main,
    "sinfo": sinfo.main,
    "squeue": squeue.main,
    "srun": srun.main,  # outside an allocation: it asks for one as sbatch does
}
CLOCKED = (scontrol, sinfo, squeue)  # the commands that read the time with datetime


class Stopped(datetime):
    """`datetime` with its clock stopped at the scene's moment."""

    @classmethod
    def now(cls, tz: tzinfo | None = None) -> Stopped:  # type: ignore[override]
        moment = NOW.astimezone(tz) if tz is not None else NOW.replace(tzinfo=None)
        return cls.fromtimestamp(moment.timestamp(), tz)  # type: ignore[return-value]


def golden_cluster() -> ClusterState:
    return cluster(*(gpu_node(f"gpu{i:02d}") for i in range(1, 5)))


def answer_from(state: ClusterState, ids: list[int]) -> Callable[[dict[str, Any]], Any]:
    """FakeApi.on_submit: the submission applied to `state`, each accepted job taking the
    next of `ids` (the captures'), as the web API would answer."""

    def submit(body: dict[str, Any]) -> tuple[int, Any]:
        spec = JobSpec.from_dict({**body, "tenant": "acme", "user": "root"})
        key = cmd_id()
        if ids:
            state.next_job_id = ids[0]
        try:
            state.apply(c.SubmitJob(key, NOW.timestamp(), spec))
        except Rejected as exc:
            return 400, {"detail": exc.message, "code": exc.code}
        ids.pop(0)
        return 201, {"job_id": state.submissions[key], "state": "PENDING"}

    return submit


class GoldenRun:
    def __init__(self, api: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
        self.api = api
        self.capsys = capsys

    def __call__(
        self, name: str, command: str, *, ids: dict[int, int] | None = None
    ) -> tuple[Capture, Capture]:
        """(ours, Slurm's) for the case `command` of golden file `name`. `ids`: the
        capture's job ids that the scene numbers otherwise (Spur gives each array task
        its own id at submit, so the jobs after an array are numbered higher), mapped in
        the command line and back in what it prints."""
        golden = capture(name, command)
        to_ours = ids or {}
        back = {ours: theirs for theirs, ours in to_ours.items()}
        outs, errs, code = [], [], 0
        for words, pipe in _pipelines(_renumber(command, to_ours)):
            code = PROGRAMS[words[0]](words[1:])
            out, err = self.capsys.readouterr()
            outs.append(_filter(pipe, out) if pipe else out)
            errs.append(err)
        ours = Capture(
            command, _renumber("".join(outs), back), _renumber("".join(errs), back), code
        )
        return ours, golden

    def submissions(self, name: str, state: ClusterState | None = None) -> ClusterState:
        """Answer sbatch as a scheduler state would, with the ids of file `name`."""
        state = state or golden_cluster()
        # Read without counting as compared (`captures`, not `capture`).
        ids = [
            int(match.group(1))
            for item in captures(name)
            if item.command.startswith("sbatch ")
            for match in [re.match(r"(?:Submitted batch job )?(\d+)", item.stdout)]
            if match
        ]
        self.api.on_submit = answer_from(state, ids)
        return state


def _renumber(text: str, ids: dict[int, int]) -> str:
    if not ids:
        return text
    pattern = r"\b(" + "|".join(str(i) for i in ids) + r")\b"
    return re.sub(pattern, lambda m: str(ids[int(m.group(1))]), text)


def _pipelines(command: str) -> list[tuple[list[str], list[str]]]:
    """`a x; b y | grep -E z` -> [(["a", "x"], []), (["b", "y"], ["grep", "-E", "z"])]."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";|")
    lexer.whitespace_split = True
    found: list[tuple[list[str], list[str]]] = []
    words: list[str] = []
    pipe: list[str] | None = None
    for token in [*lexer, ";"]:
        if token == ";":
            found.append((words, pipe or []))
            words, pipe = [], None
        elif token == "|":
            pipe = []
        elif pipe is not None:
            pipe.append(token)
        else:
            words.append(token)
    return found


def _filter(words: list[str], out: str) -> str:
    """The pipes the captures use: `grep -E RE` and `head -N`."""
    lines = out.splitlines(keepends=True)
    if words[:2] == ["grep", "-E"]:
        return "".join(line for line in lines if re.search(words[2], line))
    if words[0] == "head":
        return "".join(lines[: int(words[1].lstrip("-"))])
    raise AssertionError(f"no such pipe here: {words}")


@pytest.fixture
def golden_run(
    fake_api: FakeApi,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    utc: None,
    tmp_path: Any,
) -> GoldenRun:
    for module in CLOCKED:
        monkeypatch.setattr(module, "datetime", Stopped)
    monkeypatch.setattr(sacct, "clock", NOW.timestamp)  # sacct reads it as epoch seconds
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    for name in ("SLURM_CLUSTERS", "SBATCH_CLUSTERS", "SQUEUE_FORMAT", "SQUEUE_FORMAT2"):
        monkeypatch.delenv(name, raising=False)
    return GoldenRun(fake_api, capsys)
