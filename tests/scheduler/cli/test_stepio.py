"""srun's side of a running step (scheduler/cli/stepio.py): what it counts of each node's
stream (where a reconnection resumes), how it reads its input into pieces, and its
terminal's raw mode and size. The whole path, agents and web included, is
tests/e2e/test_step_io.py's."""

from __future__ import annotations

import base64
import os
import pty
import termios
import threading
import time

from agents.step_io import set_size
from scheduler.cli import stepio
from scheduler.core.contract.steps import MAX_STEP_INPUT_CHUNK


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_a_link_counts_each_tasks_bytes_and_ends_where_a_reconnection_resumes():
    link = stepio.Link("sim01", [0, 3], "io")
    link.account({"t": 0, "o": b64(b"hello\n")})
    link.account({"t": 3, "e": b64(b"oops\n")})
    link.account({"t": 0, "o": b64(b"again\n")})
    link.account({"t": 3, "lost": 100, "k": "o"})  # dropped before it was read: skipped
    link.account({"t": 9, "o": b64(b"not this node's\n")})
    assert link.position() == [[0, 12, 0], [3, 100, 5]]
    assert not link.done()
    link.account({"t": 0, "x": 0, "s": 0})
    link.account({"t": 3, "x": 0, "s": 9})
    assert link.exits == {0: (0, 0), 3: (0, 9)} and link.done()


def test_input_is_read_in_pieces_as_it_comes_and_ends_with_an_empty_one():
    read_end, write_end = os.pipe()
    os.write(write_end, b"a" * 1000)
    assert stepio.read_piece(read_end) == b"a" * 1000  # what is there, not a full piece

    def keep_writing() -> None:
        for _ in range(8):
            os.write(write_end, b"b" * 65536)
        os.close(write_end)

    writer = threading.Thread(target=keep_writing)
    writer.start()
    time.sleep(0.2)
    received = b""
    while piece := stepio.read_piece(read_end):
        assert len(piece) <= MAX_STEP_INPUT_CHUNK  # bounded, however much is there
        received += piece
    assert received == b"b" * 65536 * 8
    assert stepio.read_piece(read_end) == b""  # its end, again
    writer.join()
    os.close(read_end)


def test_the_terminal_is_raw_while_the_step_runs_and_as_it_was_after():
    master, slave = pty.openpty()
    try:
        set_size(master, 90, 33)
        assert stepio.window_size(slave) == (90, 33)
        before = termios.tcgetattr(slave)
        with stepio.RawTerminal(slave):
            raw = termios.tcgetattr(slave)
            assert not raw[3] & (termios.ECHO | termios.ICANON | termios.ISIG)
            assert not raw[1] & termios.OPOST  # as Slurm 22.05's srun leaves it
        assert termios.tcgetattr(slave) == before
    finally:
        os.close(master)
        os.close(slave)
    read_end, write_end = os.pipe()
    assert stepio.window_size(write_end) is None  # not a terminal: no --pty
    with stepio.RawTerminal(read_end):  # nothing to do on a pipe
        pass
    os.close(read_end)
    os.close(write_end)
