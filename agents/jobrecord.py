"""A job's record in the agent's spool, `<spool>/jobs/<id>.<attempt>/launch.json`: one JSON
object a line, each appended in one write, none ever rewritten.

    {the launch payload}               the agent, as it claims the launch
    {"running": [pid, start time]}     the job supervisor, as it starts the sandbox's
                                       monitor (agents/jobsupervisor.py)
    {"run": {...}}                     the agent, once the job runs: where it runs and
                                       writes, as whom, and its processes
                                       (agents/jobprocess.py, `JobProcess.pid_file`)
    {"signal": n}                      the agent, for each signal it delivered
    {"status": n}                      the job supervisor, when the monitor ended
    {"exit": [exit_code, signal]}      the agent, once the job's end is in the outbox

One file a job, not a file a fact: the record outlives the agent (a restarted one adopts
the job, or reports the end it recorded), and on a busy ext4 spool each file made cost a
job as much as forking its sandbox. A line cut short by a death is left out when read.
An agent of an earlier version wrote `run.json`, `signals`, `status` and `exit` files
beside the payload: they are read as well, so that it can be upgraded under running jobs.
Whether the lease ran out is the file `fenced` (written by the job supervisor, rarely).
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.jobsupervisor import RECORD, RUNNING, STATUS
from agents.supervisor import delivered_signals, read_status
from agents.supervisor import fenced as fenced_file

RUN = "run"
SIGNAL = "signal"
EXIT = "exit"
# An earlier version's files (its signals and status are a task supervisor's still).
_RUN_FILE, _EXIT_FILE = "run.json", "exit"


@dataclass(frozen=True)
class JobRecord:
    launch: Any = None  # the payload (None: claimed, never described)
    running: tuple[int, int] | None = None  # the monitor's pid and start, while no status
    run: dict[str, Any] | None = None
    signals: frozenset[int] = field(default_factory=frozenset)
    status: int | None = None
    exit: tuple[int, int] | None = None


def read(jobdir: Path, *, launch: bool = True) -> JobRecord:
    """What the job's record says (and an earlier version's files). `launch`: parse the
    payload too (the output route, polled, has no use for it)."""
    try:
        lines = (jobdir / RECORD).read_text().split("\n")
    except OSError:
        lines = []
    payload = _json(lines[0]) if lines and launch else None
    running = run = status = exit_ = None
    signals: set[int] = set()
    for line in lines[1:]:
        entry = _json(line)
        if not isinstance(entry, dict):
            continue
        if _ints(entry.get(RUNNING), 2):
            running = (entry[RUNNING][0], entry[RUNNING][1])
        if isinstance(entry.get(RUN), dict):
            run = entry[RUN]
        if isinstance(entry.get(SIGNAL), int):
            signals.add(entry[SIGNAL])
        if isinstance(entry.get(STATUS), int):
            status = entry[STATUS]
        if _ints(entry.get(EXIT), 2):
            exit_ = (entry[EXIT][0], entry[EXIT][1])
    if run is None:
        run = _json(_text(jobdir / _RUN_FILE))
        run = run if isinstance(run, dict) else None
    signals |= delivered_signals(jobdir)
    if status is None:
        status = read_status(jobdir)
    if exit_ is None and (jobdir / _EXIT_FILE).exists():
        words = _text(jobdir / _EXIT_FILE).split()
        exit_ = (int(words[0]), int(words[1])) if len(words) == 2 else (1, 0)
    return JobRecord(
        launch=payload,
        running=None if status is not None else running,
        run=run,
        signals=frozenset(signals),
        status=status,
        exit=exit_,
    )


def claim(jobdir: Path, payload: dict[str, Any]) -> None:
    """Write the launch (the record's first line) into the new directory `jobdir`. In
    place, not renamed into place: a torn line reads as a launch never described."""
    (jobdir / RECORD).write_text(json.dumps(payload) + "\n")


def append(jobdir: Path, **entry: Any) -> None:
    """Add a line to the job's record. Raises OSError when it cannot."""
    fd = os.open(jobdir / RECORD, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    try:
        os.write(fd, (json.dumps(entry) + "\n").encode())
    finally:
        os.close(fd)


def fenced(jobdir: Path) -> bool:
    """Whether the node's lease ran out on the job (its supervisor's mark, a file)."""
    return fenced_file(jobdir)


def _text(path: Path) -> str:
    with contextlib.suppress(OSError):
        return path.read_text()
    return ""


def _json(text: str) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def _ints(value: Any, count: int) -> bool:
    return (
        isinstance(value, list)
        and len(value) == count
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    )
