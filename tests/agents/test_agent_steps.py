"""A job step's tasks on the agent (agents/steps.py, agents/step_run.py, agents/step_io.py),
with real sandboxes: their output streams from a journal at the offsets a client names,
their input arrives in pieces written once each, a --pty task runs on a terminal of its
sandbox, and all of it lives through a restart of the agent (a second `Launcher` on the
same spool, the first one's pumps stopped as a dead agent's are). A step nobody streams
is killed after its grace and reported."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agents.launcher import Launcher, LaunchRequest
from agents.step_io import BACKLOG, SEGMENT, Journal, Lost
from agents.step_run import OffsetConflict, StepRun
from agents.steps import StepRefused
from tests.agents.conftest import RecordingReporter, make_payload
from tests.fixtures.platform import processes_gone

Payload = Callable[..., dict[str, Any]]


def another_launcher(launcher: Launcher, tmp_path: Path, *, grace_s: float = 30.0) -> Launcher:
    """The agent again, after a restart: the old one's pumps stop (it is dead), its
    tasks go on."""
    launcher.steps.stop()
    return Launcher(
        node="sim01",
        spool_dir=tmp_path / "spool",
        reporter=RecordingReporter(),
        work_root=launcher.workspaces.root,
        identities=launcher.identities,
        step_grace_s=grace_s,
    )


@pytest.fixture
def job(launcher: Launcher, workspace: Path) -> dict[str, Any]:
    """A running job (its batch script waits) whose steps the tests start."""
    payload = make_payload(40, "#!/bin/bash\nexec sleep 3640\n", workdir=str(workspace))
    launcher.launch(LaunchRequest.from_payload(payload))
    assert launcher.job_request(40, 1) is not None
    return payload["job"]


def step(job: dict[str, Any], step_id: int, argv: list[str], *, ntasks: int = 1,
         input: str | int = "all", pty: list[int] | None = None) -> dict[str, Any]:  # fmt: skip
    """A step launch as the controller signs it (the signature is the API's to check)."""
    return {
        "job_id": job["job_id"],
        "attempt": 1,
        "step_id": step_id,
        "node": "sim01",
        "cluster_name": "testcluster",
        "job": job,
        "step": {
            "argv": argv,
            "cwd": job["workdir"],
            "env": {"PATH": "/usr/bin:/bin", "TERM": "dumb"},
            "nodes": ["sim01"],
            "tasks_per_node": [ntasks],
            "tasks": [[rank, rank, []] for rank in range(ntasks)],
            "input": input,
            "pty": pty,
            "cpu_bind": "none",
            "name": argv[0],
        },
    }


class Read:
    """What a stream sent: each task's output and end."""

    def __init__(self) -> None:
        self.out: dict[int, bytes] = {}
        self.err: dict[int, bytes] = {}
        self.exits: dict[int, tuple[int, int]] = {}
        self.events: list[dict[str, Any]] = []


Offsets = dict[int, tuple[int, int]]


async def read(
    run: StepRun,
    offsets: Offsets | None = None,
    *,
    until: Callable[[Read], bool] | None = None,
    timeout: float = 30.0,
) -> Read:
    found = Read()
    stream = run.stream(offsets or {})
    try:
        async with asyncio.timeout(timeout):
            async for line in stream:
                event = json.loads(line)
                found.events.append(event)
                rank = event.get("t")
                if "o" in event:
                    found.out[rank] = found.out.get(rank, b"") + base64.b64decode(event["o"])
                if "e" in event:
                    found.err[rank] = found.err.get(rank, b"") + base64.b64decode(event["e"])
                if "x" in event:
                    found.exits[rank] = (event["x"], event["s"])
                if until is not None and until(found):
                    break
    finally:
        await stream.aclose()
    return found


def lines(data: bytes) -> int:
    return data.count(b"\n")


# -- the journal --------------------------------------------------------------------------


def test_the_journal_keeps_a_stream_in_segments_and_drops_what_is_far_behind(tmp_path: Path):
    journal = Journal(tmp_path, "out")
    data = os.urandom(SEGMENT * 2 + 1000)
    journal.append(data[:100])
    journal.append(data[100:])
    assert journal.size == len(data)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.0", "out.1", "out.2"]
    assert journal.read(SEGMENT - 10, 100) == data[SEGMENT - 10 : SEGMENT]  # a segment's end
    assert journal.read(len(data)) == b""
    journal.trim(SEGMENT + 5)  # only wholly older segments go
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.1", "out.2"]
    with pytest.raises(Lost) as lost:
        journal.read(10)
    assert lost.value.at == SEGMENT
    # An agent that restarts finds it as it was.
    again = Journal(tmp_path, "out")
    assert (again.size, again.first) == (len(data), 1)
    assert again.read(SEGMENT * 2, 1000) == data[SEGMENT * 2 :]


# -- output and input ---------------------------------------------------------------------


def test_each_tasks_output_and_end_stream_and_a_launch_runs_once(launcher: Launcher, job):
    script = "echo out $SLURM_PROCID; echo err >&2; exit $((SLURM_PROCID + 2))"
    run = launcher.steps.start(step(job, 0, ["bash", "-c", script], ntasks=2))
    found = asyncio.run(read(run))
    assert found.out == {0: b"out 0\n", 1: b"out 1\n"}
    assert found.err == {0: b"err\n", 1: b"err\n"}
    assert found.exits == {0: (2, 0), 1: (3, 0)}
    assert found.events[0] == {}  # its first line says it runs
    with pytest.raises(StepRefused) as again:
        launcher.steps.start(step(job, 0, ["true"]))
    assert again.value.code == "step_launched"


def test_a_stream_resumes_at_the_offsets_its_client_names(launcher: Launcher, job):
    run = launcher.steps.start(step(job, 1, ["bash", "-c", "seq 1 2000; echo done >&2"]))
    whole = asyncio.run(read(run))
    assert whole.out[0] == b"".join(b"%d\n" % i for i in range(1, 2001))
    cut = len(b"".join(b"%d\n" % i for i in range(1, 1001)))
    rest = asyncio.run(read(run, {0: (cut, 3)}))
    assert rest.out[0] == b"".join(b"%d\n" % i for i in range(1001, 2001))
    assert rest.err[0] == b"e\n" and rest.exits == {0: (0, 0)}


def test_input_is_written_in_pieces_each_once_then_its_end(launcher: Launcher, job):
    run = launcher.steps.start(step(job, 2, ["bash", "-c", "wc -l; cat"], ntasks=2))

    async def feed() -> Read:
        data = b"".join(b"%d\n" % i for i in range(100000))
        written = 0
        while written < len(data):
            answer = await run.write_input(written, data[written : written + 200_000], False)
            written = answer["written"]
        # The same piece again, or one past where the input is, writes nothing.
        with pytest.raises(OffsetConflict) as repeated:
            await run.write_input(0, b"again\n", False)
        assert repeated.value.written == len(data)
        with pytest.raises(OffsetConflict):
            await run.write_input(len(data) + 1, b"gap\n", False)
        assert await run.write_input(len(data), b"", True) == {"written": len(data), "eof": True}
        return await read(run)

    found = asyncio.run(feed())
    # Every task reads srun's input (Slurm's --input=all) to its end.
    assert found.out == {0: b"100000\n", 1: b"100000\n"}
    assert found.exits == {0: (0, 0), 1: (0, 0)}


def test_input_goes_to_one_task_or_none(launcher: Launcher, job):
    one = launcher.steps.start(step(job, 3, ["cat"], ntasks=2, input=1))

    async def feed() -> Read:
        await one.write_input(0, b"one\n", True)
        return await read(one)

    found = asyncio.run(feed())
    assert found.out == {1: b"one\n"} and found.exits == {0: (0, 0), 1: (0, 0)}
    none = launcher.steps.start(step(job, 4, ["cat"], input="none"))
    assert asyncio.run(read(none)).exits == {0: (0, 0)}  # its stdin is /dev/null

    async def refused() -> None:
        with pytest.raises(Exception, match="no task of step 40.4 on this node reads"):
            await none.write_input(0, b"x", False)

    asyncio.run(refused())


def test_a_task_that_reads_slowly_takes_part_of_a_piece_and_srun_waits(
    launcher: Launcher, job, monkeypatch: pytest.MonkeyPatch
):
    from agents import step_run

    monkeypatch.setattr(step_run, "INPUT_WAIT_S", 0.5)
    run = launcher.steps.start(step(job, 5, ["bash", "-c", "sleep 3; wc -c"]))

    async def feed() -> tuple[int, Read]:
        data = b"x" * (200 * 1024)  # more than a pipe holds: the task reads nothing yet
        first = (await run.write_input(0, data, False))["written"]
        written = first
        while written < len(data):
            written = (await run.write_input(written, data[written:], False))["written"]
        await run.write_input(written, b"", True)
        return first, await read(run)

    first, found = asyncio.run(feed())
    assert 0 < first < 200 * 1024  # back-pressure: it took what the pipe holds
    assert found.out == {0: b"204800\n"}


def test_a_task_that_writes_while_nobody_reads_blocks_instead_of_filling_the_disk(
    launcher: Launcher, job
):
    run = launcher.steps.start(step(job, 6, ["bash", "-c", "yes $(seq 1 100)"]))
    time.sleep(2.0)
    taskdir = run.tasks[0].taskdir
    spooled = sum(p.stat().st_size for p in taskdir.glob("out.*"))
    assert BACKLOG <= spooled < BACKLOG + 2 * 65536  # a chunk past the backlog, no more
    time.sleep(1.0)
    assert sum(p.stat().st_size for p in taskdir.glob("out.*")) == spooled
    assert launcher.steps.signal(40, 1, signal.SIGKILL, 6)
    found = asyncio.run(read(run))
    assert found.exits == {0: (0, 9)}


# -- a terminal ---------------------------------------------------------------------------


def test_pty_runs_task_0_on_a_terminal_of_its_sandbox_of_the_size_asked(launcher: Launcher, job):
    script = "tty; stty size; read x; echo got=$x; [ -t 0 ] && echo interactive"
    run = launcher.steps.start(step(job, 7, ["bash", "-c", script], ntasks=2, pty=[100, 30]))

    async def session() -> tuple[Read, Read]:
        # Typed once it asks (a terminal echoes what is typed the moment it comes).
        first = await read(run, until=lambda r: b"30 100\r\n" in r.out.get(0, b""))
        await run.write_input(0, b"hi\r", False)
        return first, await read(run, {0: (len(first.out[0]), 0)})

    first, found = asyncio.run(session())
    assert first.out[0] == b"/dev/pts/0\r\n30 100\r\n"
    assert found.out[0] == b"hi\r\ngot=hi\r\ninteractive\r\n"
    assert 1 not in found.out  # Slurm sends the other tasks' output nowhere
    assert found.exits[0] == (0, 0) and found.exits[1] == (1, 0)  # its `tty` is no terminal


def test_a_resize_reaches_the_terminal_and_a_step_without_one_refuses_it(launcher, job):
    run = launcher.steps.start(step(job, 8, ["bash", "-c", "read x; stty size"], pty=[80, 24]))
    run.resize(132, 43)

    async def session() -> Read:
        await run.write_input(0, b"\r", False)
        return await read(run)

    assert asyncio.run(session()).out[0].endswith(b"43 132\r\n")
    plain = launcher.steps.start(step(job, 9, ["true"]))
    with pytest.raises(Exception, match="has no terminal"):
        plain.resize(80, 24)


# -- a restart of the agent ---------------------------------------------------------------


def test_a_restarted_agent_adopts_a_step_and_its_stream_goes_on_where_it_stopped(
    launcher: Launcher, job, tmp_path: Path
):
    script = "for i in $(seq 1 30); do echo line $i; sleep 0.05; done; exit 4"
    run = launcher.steps.start(step(job, 10, ["bash", "-c", script]))
    first = asyncio.run(read(run, until=lambda r: lines(r.out.get(0, b"")) >= 5))
    again = another_launcher(launcher, tmp_path)
    again.recover(poll_s=0.05)
    adopted = again.steps.find(40, 1, 10)
    assert adopted is not None and again.steps.running() == [(40, 1)]
    assert adopted.tasks[0].taskdir in again.steps.lease_dirs()
    rest = asyncio.run(read(adopted, {0: (len(first.out[0]), 0)}))
    text = (first.out[0] + rest.out[0]).decode().splitlines()
    assert text == [f"line {i}" for i in range(1, 31)]
    assert rest.exits == {0: (4, 0)}
    again.kill_all(timeout=5)


def test_a_task_that_ends_while_no_agent_runs_keeps_its_last_output_and_status(
    launcher: Launcher, job, tmp_path: Path
):
    run = launcher.steps.start(step(job, 11, ["bash", "-c", "read x; echo last words; exit 6"]))
    launcher.steps.stop()  # the agent is gone; its input is written by hand, by name
    fd = os.open(run.tasks[0].taskdir / "stdin", os.O_WRONLY)
    os.write(fd, b"go\n")
    os.close(fd)
    status = run.tasks[0].taskdir / "status"
    deadline = time.monotonic() + 10
    while not status.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert status.read_text() == "6\n"  # ended, its supervisor waiting to be released
    again = another_launcher(launcher, tmp_path)
    again.recover(poll_s=0.05)
    adopted = again.steps.find(40, 1, 11)
    assert adopted is not None
    found = asyncio.run(read(adopted))
    assert found.out == {0: b"last words\n"} and found.exits == {0: (6, 0)}
    with pytest.raises(StepRefused):  # its launch, replayed, finds it launched
        again.steps.start(step(job, 11, ["true"]))
    again.kill_all(timeout=5)


def test_a_terminal_outlives_its_agent_and_the_next_one_takes_it_back(
    launcher: Launcher, job, tmp_path: Path
):
    run = launcher.steps.start(step(job, 12, ["bash", "--norc", "-i"], pty=[80, 24]))

    async def type_(run: StepRun, offset: int, text: bytes, until: bytes, at: int) -> Read:
        await run.write_input(offset, text, False)
        return await read(run, {0: (at, 0)}, until=lambda r: until in r.out.get(0, b""))

    first = asyncio.run(type_(run, 0, b"echo one-$((1 + 1))\r", b"one-2", 0))
    again = another_launcher(launcher, tmp_path)
    again.recover(poll_s=0.05)
    adopted = again.steps.find(40, 1, 12)
    assert adopted is not None and adopted.master >= 0
    typed = len(b"echo one-$((1 + 1))\r")
    seen = len(first.out[0])
    later = asyncio.run(type_(adopted, typed, b"echo two-$((2 + 1))\r", b"two-3", seen))
    assert b"two-3" in later.out[0] and b"one-2" not in later.out[0]
    asyncio.run(adopted.write_input(typed + len(b"echo two-$((2 + 1))\r"), b"exit 5\r", False))
    assert asyncio.run(read(adopted, {0: (seen + len(later.out[0]), 0)})).exits == {0: (5, 0)}
    again.kill_all(timeout=5)


# -- srun gone for good -------------------------------------------------------------------


def test_a_step_nobody_streams_is_killed_after_its_grace_and_reported(
    launcher: Launcher, job, tmp_path: Path
):
    again = another_launcher(launcher, tmp_path, grace_s=0.5)
    reported: list[tuple[int, int, int, bool]] = []
    again.steps.on_orphan = lambda run, code, sig, cancelled: reported.append(
        (run.step_id, code, sig, cancelled)
    )
    again.recover(poll_s=0.05)
    run = again.steps.start(step(job, 13, ["sleep", "3613"]))
    asyncio.run(read(run, until=lambda r: True))  # a stream came and went: srun is gone
    deadline = time.monotonic() + 15
    while not reported and time.monotonic() < deadline:
        time.sleep(0.1)
    assert reported == [(13, 0, 9, True)]
    assert processes_gone("sleep 3613")
    # Once delivered (or given up) for long enough, its spool goes, but not before its
    # launch could be replayed.
    now = time.monotonic()
    again.steps.sweep(now=now + 3600)
    assert again.steps.find(40, 1, 13) is not None  # its launch is still fresh
    run.created -= 3600
    again.steps.sweep(now=now + 3600)
    assert again.steps.find(40, 1, 13) is None and not run.stepdir.exists()
    again.kill_all(timeout=5)


def test_the_end_of_the_job_ends_its_steps(launcher: Launcher, job):
    run = launcher.steps.start(step(job, 14, ["sleep", "3614"]))
    assert launcher.signal(40, 1, signal.SIGKILL)
    found = asyncio.run(read(run))
    assert found.exits == {0: (0, 9)}
    assert processes_gone("sleep 3614")
