"""A step's input, terminal and reconnection end to end (docs/architecture.md, "Job
steps"), through every real process: srun inside batch jobs (talking to the agents) and
outside them (salloc's command, through the web), a terminal driven by Python's pty
module as a person's would be, and an agent killed and started again under a running
step. The spare node `sim09` is an agent of this test's own, so that it can kill it."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import pty
import re
import select
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agents.step_io import set_size
from tests.e2e.test_steps import sacct_rows, script, submit, wait_ended
from tests.fixtures.platform import Platform, job_processes, start_platform
from tests.fixtures.processes import BIN, Processes, free_port, wait_until

pytestmark = pytest.mark.e2e

SPARE = "sim09"


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    yield from start_platform(tmp_path_factory.mktemp("stepio"), nodes="sim01=h100-8")


@pytest.fixture
def here(platform: Platform, request: pytest.FixtureRequest) -> Path:
    return platform.workspace_dir(re.sub(r"\W", "_", request.node.name))


def outside(platform: Platform) -> dict[str, str]:
    """salloc's command finds srun on its PATH, as on a login node."""
    return {"PATH": f"{BIN}:{os.environ['PATH']}"}


# -- input ------------------------------------------------------------------------------


def test_a_pipe_of_100000_lines_reaches_the_task_inside_a_batch_job(platform, here):
    job = script(here / "wc.sh", "seq 1 100000 | srun -n1 wc -l\necho rc=$?\n")
    job_id = submit(platform, "-t", "3", "-o", "wc-%j.out", job, cwd=here)
    state = wait_ended(platform, job_id)
    output = (here / f"wc-{job_id}.out").read_text()
    assert state[2:] == ["COMPLETED", "0:0"], output
    assert output.split() == ["100000", "rc=0"]


def test_a_pipe_of_100000_lines_reaches_the_task_from_salloc(platform, here):
    result = platform.cli(
        "salloc", "-N1", "sh", "-c", "seq 1 100000 | srun -n1 wc -l",
        cwd=here, timeout=180, input="", env=outside(platform),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["100000"]


SLOW = (
    # The producer writes its second line only once the task has answered the first:
    # were srun's input read to its end before the step ran, neither would ever end.
    "(echo ping; while [ ! -e pong ]; do sleep 0.1; done; echo done) | "
    'srun -n1 sh -c \'read x; echo "$x"; touch pong; read y; echo "$y"\''
)


def test_input_that_comes_slowly_reaches_the_task_before_its_end(platform, here):
    job = script(here / "slow.sh", SLOW + "\n")
    job_id = submit(platform, "-t", "2", "-o", "slow-%j.out", job, cwd=here)
    wait_ended(platform, job_id)
    assert (here / f"slow-{job_id}.out").read_text() == "ping\ndone\n"
    (here / "pong").unlink()
    result = platform.cli("salloc", "-N1", "sh", "-c", SLOW, cwd=here, timeout=120, input="",
                          env=outside(platform))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ping\ndone\n"


def test_input_goes_to_every_task_one_or_none_as_slurms(platform, here):
    # Slurm 22.05.8 on the peer: `echo x | srun -n2 -l cat` gives "0: x" and "1: x".
    job = script(
        here / "modes.sh",
        "echo all | srun -n2 -l cat | sort\n"
        "echo one | srun -n2 -l -i 1 cat\n"
        "echo none | srun -n2 -l -i none cat\n"
        "printf 'from a file\\n' > in.txt\n"
        "srun -n2 -l -i in.txt cat | sort\n"
        "srun -n2 -i 7 cat; echo rc=$?\n",
    )
    job_id = submit(platform, "-n2", "-t", "2", "-o", "modes-%j.out", job, cwd=here)
    wait_ended(platform, job_id)
    assert (here / f"modes-{job_id}.out").read_text() == (
        "0: all\n1: all\n"
        "1: one\n"
        "0: from a file\n1: from a file\n"
        "srun: error: Could not open stdin file: No such file or directory\nrc=1\n"
    )


# -- a terminal (--pty) ---------------------------------------------------------------------


class Terminal:
    """A person's terminal: the master side of a pty whose slave runs a command."""

    def __init__(self, argv: list[str], *, env: dict[str, str], cwd: Path, size: tuple[int, int]):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: its stdio are the terminal
            os.chdir(cwd)
            os.execve(argv[0], argv, env)
        set_size(self.fd, *size)
        self.seen = b""

    def expect(self, pattern: bytes, timeout: float = 60.0) -> bytes:
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self.seen):
            left = deadline - time.monotonic()
            assert left > 0, f"no {pattern!r} in {self.seen[-2000:]!r}"
            if select.select([self.fd], [], [], left)[0]:
                try:
                    chunk = os.read(self.fd, 65536)
                except OSError:  # EIO: the command has ended
                    chunk = b""
                assert chunk, f"the terminal closed without {pattern!r}: {self.seen[-2000:]!r}"
                self.seen += chunk
        return self.seen

    def type(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def exit_code(self, timeout: float = 60.0) -> int:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError):
                if select.select([self.fd], [], [], 0.1)[0]:
                    self.seen += os.read(self.fd, 65536)
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            assert time.monotonic() < deadline, self.seen[-2000:]


def test_srun_pty_in_salloc_is_a_terminal_of_the_window_size_and_gives_it_back(platform, here):
    # `srun --pty bash` inside `salloc`, as a person types it at a terminal of 100x30.
    line = (
        "stty -g > before; salloc -N1 srun --pty bash --norc -i; echo salloc-rc=$?; stty -g > after"
    )
    env = {**platform.env, **outside(platform), "TERM": "xterm", "PS1": "prompt$ "}
    terminal = Terminal(["/bin/sh", "-c", line], env=env, cwd=here, size=(100, 30))
    try:
        terminal.expect(rb"prompt\$ ")
        terminal.type("tty; stty size; echo $((6 * 7))\r")
        seen = terminal.expect(rb"\n42\r\n")
        assert b"/dev/pts/0\r\n30 100\r\n" in seen
        # A new window size reaches the task's terminal (SIGWINCH to srun).
        set_size(terminal.fd, 120, 40)
        time.sleep(1.0)
        terminal.type("stty size\r")
        terminal.expect(rb"40 120\r\n")
        terminal.type("exit 7\r")
        terminal.expect(rb"salloc-rc=7")
        assert terminal.exit_code() == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(terminal.pid, signal.SIGKILL)
    # srun put the terminal back as it found it.
    assert (here / "before").read_text() == (here / "after").read_text()


# -- the step's I/O credential and its pieces of input: try to break them ---------------------


def _io_step(platform: Platform, here: Path) -> tuple[int, dict, str]:
    """A job, and a step of it created with its step credential (as srun inside it
    does): the step's launch, sent to its agent here, and the controller's URL."""
    job = script(
        here / "io.sh", 'echo "$SPUR_STEP_TOKEN $SPUR_STEP_URL" > io.cred\nexec sleep 3500\n'
    )
    job_id = submit(platform, "-w", "sim01", job, cwd=here)
    wait_until(lambda: (here / "io.cred").read_text().strip() != "", timeout=60, what="creds")
    token, urls = (here / "io.cred").read_text().split()
    url = urls.split(",")[0]
    created = httpx.post(
        f"{url}/v1/jobs/{job_id}/steps",
        json={"argv": ["cat"], "cwd": str(here)},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert created.status_code == 201, created.text
    return job_id, created.json(), url


def test_a_steps_input_takes_only_its_credential_each_piece_once_and_bounded(platform, here):
    job_id, created, _ = _io_step(platform, here)
    launch = created["launches"][0]
    step_id = created["step_id"]
    base = f"{launch['agent_url']}/v1/jobs/{job_id}/steps/{step_id}"
    io = launch["io"]

    def send(token: str, body: dict, path: str = "input") -> httpx.Response:
        return httpx.post(f"{base}/{path}", json=body, timeout=30,
                          headers={"Authorization": f"Bearer {token}"})  # fmt: skip

    piece = {"offset": 0, "data": base64.b64encode(b"hello\n").decode()}
    with httpx.stream("POST", f"{launch['agent_url']}/v1/jobs/{job_id}/steps",
                      json=launch["payload"], timeout=60) as stream:  # fmt: skip
        assert stream.status_code == 200
        lines = stream.iter_lines()
        # Forged, for another step, for another node, none: refused, nothing written.
        forged = io[:-4] + ("0000" if not io.endswith("0000") else "1111")
        assert send(forged, piece).status_code == 401
        other_step = io.replace(f".{step_id}.sim01.", f".{step_id + 1}.sim01.")
        assert send(other_step, piece).status_code == 401
        assert send(io.replace(".sim01.", ".sim02."), piece).status_code == 401
        assert httpx.post(f"{base}/input", json=piece, timeout=30).status_code == 401
        # The credential's own step: written once; the same piece again is refused and
        # says where the input is; a piece larger than a piece may be is refused.
        first = send(io, piece)
        assert first.status_code == 200 and first.json() == {"written": 6, "eof": False}
        again = send(io, piece)
        assert again.status_code == 409
        assert again.json()["code"] == "offset" and again.json()["written"] == 6
        big = base64.b64encode(b"x" * (256 * 1024 + 1)).decode()
        assert send(io, {"offset": 6, "data": big}).status_code == 413
        assert send(io, {"cols": 80, "rows": 24}, "resize").status_code == 409  # no --pty
        # A terminal's resize, a signal, an attach: the same credential, the same refusals.
        assert send(forged, {"cols": 80, "rows": 24}, "resize").status_code == 401
        assert send(other_step, {"signal": 9}, "signal").status_code == 401
        assert send(forged, {"offsets": []}, "attach").status_code == 401
        assert send(io, {"offset": 6, "eof": True}).json() == {"written": 6, "eof": True}
        output = b""
        for raw in lines:
            event = json.loads(raw) if raw else {}
            output += base64.b64decode(event.get("o", ""))
            if "x" in event:
                assert (event["x"], event["s"]) == (0, 0)
                break
        assert output == b"hello\n"
    # Through the web, as srun outside the job sends it: the same refusals.
    web = f"{platform.web_url}/api/v1/jobs/{job_id}/steps/{step_id}/input"
    headers = {"Authorization": f"Bearer {platform.token}"}
    answer = httpx.post(web, json={"node": "sim01", "io": forged, **piece}, headers=headers)
    assert answer.status_code == 403, answer.text
    answer = httpx.post(web, json={"node": "sim02", "io": io, **piece}, headers=headers)
    assert answer.status_code == 404  # not a node of this job
    assert platform.cli("scancel", str(job_id)).returncode == 0


# -- an agent that restarts under a running step ------------------------------------------


@pytest.fixture(scope="module")
def spare(platform: Platform, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Spare]:
    agent = Spare(platform, Processes(tmp_path_factory.mktemp("spare-logs")))
    agent.start()
    try:
        yield agent
    finally:
        agent.procs.stop_all()


class Spare:
    """The test's own agent: started, killed (SIGKILL, as a crash) and started again."""

    def __init__(self, platform: Platform, procs: Processes) -> None:
        self.platform = platform
        self.procs = procs
        self.port = free_port()
        # The platform's spur.toml, with a short grace for a step whose srun is gone.
        config = platform.state_dir / f"{SPARE}.toml"
        config.write_text((platform.state_dir / "spur.toml").read_text() + "step_grace_s = 5\n")
        self.argv = [
            str(BIN / "spurd"),
            "--config", str(config),
            "--name", SPARE,
            "--listen", f"127.0.0.1:{self.port}",
            "--devices", "sim:h100-8",
            "--spool-dir", str(platform.state_dir / "agents" / SPARE),
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = self.procs.start(SPARE, self.argv)
        wait_until(self.up, timeout=60, what=f"{SPARE} up")

    def up(self) -> bool:
        rows = self.platform.cli("sinfo", "-N", "-h", "-o", "%N %t").stdout.split("\n")
        return any(r.split() == [SPARE, "idle"] or r.split() == [SPARE, "mix"] for r in rows)

    def crash(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)  # spurd only: its tasks' supervisors live on
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)

    def log(self) -> str:
        return (self.procs.log_dir / f"{SPARE}.log").read_text(errors="replace")


LINES = "for i in $(seq 1 60); do echo line $i; sleep 0.1; done; exit 3"


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("line ")]


def test_a_step_inside_a_job_lives_through_its_agents_restart(platform, here, spare):
    job = script(here / "restart.sh", f"srun -n1 bash -c '{LINES}'\necho rc=$?\n")
    job_id = submit(platform, "-w", SPARE, "-t", "3", "-o", "restart-%j.out", job, cwd=here)
    out = here / f"restart-{job_id}.out"
    wait_until(lambda: len(_lines(out.read_text())) >= 10, timeout=90, what="ten lines")
    spare.crash()
    time.sleep(1.0)
    spare.start()
    state = wait_ended(platform, job_id, timeout=120)
    text = out.read_text()
    # Every line once, in order; srun's exit code is the task's.
    assert _lines(text) == [f"line {i}" for i in range(1, 61)], text + spare.log()[-3000:]
    assert "rc=3" in text.splitlines()
    assert state[2:] == ["COMPLETED", "0:0"], text


def test_a_step_from_salloc_lives_through_its_agents_restart(platform, here, spare):
    done: dict[str, subprocess.CompletedProcess[str]] = {}

    def run() -> None:
        done["result"] = platform.cli(
            "salloc", "-w", SPARE, "srun", "-n1", "bash", "-c", LINES,
            cwd=here, timeout=240, input="", env=outside(platform),
        )  # fmt: skip

    thread = threading.Thread(target=run)
    thread.start()
    spool = platform.state_dir / "agents" / SPARE / "steps"

    def running() -> bool:
        return any(
            len(_lines((d / "0" / "out.0").read_text())) >= 10
            for d in spool.glob("*.*.0")
            if (d / "0" / "out.0").exists()
        )

    wait_until(running, timeout=120, what="the step's first lines")
    spare.crash()
    time.sleep(1.0)
    spare.start()
    thread.join(240)
    result = done["result"]
    assert _lines(result.stdout) == [f"line {i}" for i in range(1, 61)], (
        result.stdout + result.stderr
    )
    assert result.returncode == 3, result.stderr
    assert "srun: error: sim09: task 0: Exited with exit code 3" in result.stderr


def test_a_step_whose_srun_is_gone_is_cancelled_after_its_grace(platform, here, spare):
    # Slurm cancels the step of an srun killed with SIGKILL (the peer: within seconds).
    job = script(here / "orphan.sh", "srun -n1 sleep 3987 &\nexec sleep 3600\n")
    job_id = submit(platform, "-w", SPARE, "-t", "5", job, cwd=here)

    def task() -> list[int]:  # the step's task, not srun (whose command line holds it too)
        return [
            pid
            for pid in job_processes("sleep 3987")
            if b"srun" not in Path(f"/proc/{pid}/cmdline").read_bytes()
        ]

    wait_until(task, timeout=60, what="the step's task")
    [srun] = job_processes("srun -n1 sleep 3987")
    os.kill(srun, signal.SIGKILL)
    wait_until(lambda: not task(), timeout=30, what="the task killed")
    rows = {}

    def cancelled() -> bool:
        rows.update({r[0]: r for r in sacct_rows(platform, job_id)})
        return rows.get(f"{job_id}.0", ["", "", ""])[2].startswith("CANCELLED")

    wait_until(cancelled, timeout=30, what="the step cancelled")
    assert rows[str(job_id)][2] == "RUNNING"  # the job goes on
    assert platform.cli("scancel", str(job_id)).returncode == 0
