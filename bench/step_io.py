"""A job step's input and terminal: how fast srun's stdin reaches a task, and how long a
keystroke takes to come back through `srun --pty` (docs/architecture.md, "Job steps").

Starts the embedded platform with one simulated node, then measures:

- input, inside a job: `seq 1 1000000 | srun -n1 wc -l` in a batch script (6.9 MB, srun
  talking to the agent), timed inside the job, after one run that is not counted;
- input, from salloc: the same from salloc's command (srun talking to the web, which
  carries each piece to the agent);
- keystroke: in `salloc srun --pty bash` on a pty, from writing `echo k<i>` to reading
  `k<i>` back (the web, the agent, the task's terminal, and back), 40 times after 5 that
  are not counted.

    python bench/step_io.py

Prints a table and, last, one JSON line.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from embedded import on_platform  # noqa: E402

from agents.step_io import set_size  # noqa: E402
from spurcloud.stack import Stack  # noqa: E402

BIN = Path(sys.executable).parent
LINES = 1_000_000
KEYSTROKES = 40


def main() -> int:
    return on_platform("spur-bench-stepio-", [("sim01", "h100-8")], run)


def run(stack: Stack, creds: dict[str, str]) -> int:
    env = {
        **os.environ,
        "SPUR_API_URL": stack.web_url,
        "SPUR_TOKEN": creds["token"],
        "PATH": f"{BIN}:{os.environ['PATH']}",
    }
    here = workspace(stack, env)
    inside = [batch_input(here, env) for _ in range(3)][1:]
    outside = [salloc_input(here, env) for _ in range(3)][1:]
    keystrokes = keystroke_round_trips(here, env)
    mb = len(b"".join(b"%d\n" % i for i in range(1, LINES + 1))) / 1e6
    rows = [
        ("input inside a job (MB/s)", mb / min(inside)),
        ("input from salloc (MB/s)", mb / min(outside)),
        ("keystroke p50 (ms)", 1000 * statistics.median(keystrokes)),
        ("keystroke p90 (ms)", 1000 * sorted(keystrokes)[int(0.9 * len(keystrokes))]),
    ]
    for name, value in rows:
        print(f"{name:<30} {value:10.1f}")
    print(json.dumps({name: round(value, 1) for name, value in rows}))
    return 0


def creds_organization(stack: Stack) -> str:
    line = (stack.state_dir / "demo.env").read_text()
    return Path(line.split("SPUR_WORKSPACE=")[1].split("\n")[0]).name


def workspace(stack: Stack, env: dict[str, str]) -> Path:
    """A directory of the demo organisation's workspace (its first job makes it)."""
    subprocess.run([str(BIN / "sbatch"), "--wrap", "true"], env=env, check=True,
                   capture_output=True)  # fmt: skip
    root = stack.workspaces / creds_organization(stack)
    deadline = time.monotonic() + 60
    while not root.exists():
        assert time.monotonic() < deadline, "no workspace"
        time.sleep(0.2)
    here = root / "bench-stepio"
    here.mkdir(exist_ok=True)
    owner = root.stat()
    os.chown(here, owner.st_uid, owner.st_gid)
    return here


def batch_input(here: Path, env: dict[str, str]) -> float:
    script = here / "input.sh"
    script.write_text(
        "#!/bin/bash\nstart=$(date +%s.%N)\n"
        f"seq 1 {LINES} | srun -n1 wc -l\n"
        'echo "seconds $(echo "$(date +%s.%N) - $start" | bc)"\n'
    )
    out = here / "input.out"
    out.unlink(missing_ok=True)
    done = subprocess.run(
        [str(BIN / "sbatch"), "--wait", "-t", "5", "-o", str(out), str(script)],
        env=env, cwd=here, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    text = out.read_text()
    assert done.returncode == 0 and f"{LINES}\n" in text, (done.stderr, text)
    return float(re.search(r"seconds (\S+)", text).group(1))  # type: ignore[union-attr]


def salloc_input(here: Path, env: dict[str, str]) -> float:
    line = (
        f"start=$(date +%s.%N); seq 1 {LINES} | srun -n1 wc -l; "
        'echo "seconds $(echo "$(date +%s.%N) - $start" | bc)"'
    )
    done = subprocess.run(
        [str(BIN / "salloc"), "-N1", "sh", "-c", line],
        env=env, cwd=here, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0 and f"{LINES}\n" in done.stdout, done.stderr
    return float(re.search(r"seconds (\S+)", done.stdout).group(1))  # type: ignore[union-attr]


def keystroke_round_trips(here: Path, env: dict[str, str]) -> list[float]:
    shell = {**env, "TERM": "dumb", "PS1": "$ "}
    pid, fd = pty.fork()
    if pid == 0:
        os.chdir(here)
        argv = [str(BIN / "salloc"), "-N1", "srun", "--pty", "bash", "--norc", "-i"]
        os.execve(argv[0], argv, shell)
    set_size(fd, 120, 40)
    seen = bytearray()

    def wait_for(pattern: bytes, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while pattern not in seen:
            assert time.monotonic() < deadline, bytes(seen[-500:])
            if select.select([fd], [], [], 1.0)[0]:
                seen.extend(os.read(fd, 65536))

    wait_for(b"$ ")
    times = []
    for i in range(KEYSTROKES + 5):
        seen.clear()
        start = time.monotonic()
        os.write(fd, f"echo k{i}x\r".encode())
        wait_for(f"\nk{i}x".encode())
        times.append(time.monotonic() - start)
    os.write(fd, b"exit\r")
    os.waitpid(pid, 0)
    return times[5:]


if __name__ == "__main__":
    raise SystemExit(main())
