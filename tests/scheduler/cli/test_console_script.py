"""The installed console scripts (`script = COMMAND.script`): a command's output all
written and its exit status kept, though the process ends without the interpreter's
teardown (`console.exit_now`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.cli import sacct

BIN = Path(sys.executable).parent


def test_a_script_writes_all_its_output_and_exits_with_the_commands_status() -> None:
    done = subprocess.run([BIN / "sacct", "--helpformat"], capture_output=True, text=True)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == sacct.helpformat(sacct.parse_args(["-e"], sacct_now())) + "\n"
    refused = subprocess.run([BIN / "sacct", "--bogus"], capture_output=True, text=True)
    assert refused.returncode == sacct.main(["--bogus"]) != 0
    assert "unrecognized option '--bogus'" in refused.stderr


@pytest.mark.parametrize("unbuffered", ["", "1"])  # written at exit, or by print itself
def test_a_reader_that_went_away_ends_it_by_sigpipe_as_slurms_own(unbuffered: str) -> None:
    read, write = os.pipe()
    os.close(read)  # like `| head -0` that already ended: any write meets EPIPE
    try:
        done = subprocess.run(
            [BIN / "sacct", "--helpformat"],
            stdout=write,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": unbuffered},
        )
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (-signal.SIGPIPE, b"")


def sacct_now():  # type: ignore[no-untyped-def]
    from datetime import datetime

    return datetime.now().astimezone()
