"""How the agent names a process for the life of the machine: its pid and start time,
read from /proc (agents/jobprocess.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from agents.jobprocess import process_start_time, still_running

# A name as a job may give itself: spaces and parentheses, which /proc/<pid>/stat shows
# as they are, inside its own parentheses.
ODD_NAME = "a) b (c"
NAMED = f"open('/proc/self/comm', 'w').write({ODD_NAME!r}); import time; time.sleep(60)"


def start_time_of(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat, counted from the end of the line's name."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b") ", 1)[1].split()[19])


def test_a_process_is_known_by_its_start_time_whatever_its_name() -> None:
    child = subprocess.Popen([sys.executable, "-c", NAMED])
    try:
        deadline = time.monotonic() + 10
        while Path(f"/proc/{child.pid}/comm").read_text().strip() != ODD_NAME:
            assert time.monotonic() < deadline, "the child never renamed itself"
            time.sleep(0.01)
        start = process_start_time(child.pid)
        assert start == start_time_of(child.pid) > 0
        assert still_running(child.pid, start)
        assert not still_running(child.pid, start + 1)  # another process with that pid
        os.kill(child.pid, signal.SIGKILL)
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
        # A zombie keeps its start time, and runs no more.
        assert process_start_time(child.pid) == start
        assert not still_running(child.pid, start)
    finally:
        child.kill()
        child.wait()
    assert process_start_time(child.pid) == -1
    assert not still_running(child.pid, start)
