"""A job's output, read back from this node for the web (`GET /v1/jobs/{id}/output`).

The newest attempt of the job that this agent launched is found in its spool (so it
works after the job ended and after the agent restarted); its record (agents/jobrecord.py)
says where its output and error files are. They lie in a tenant's workspace, where the job may have
replaced them with a symlink to anything this root process could read: they are opened
one component at a time without following any link (`open_beneath`), and only a regular
file is read. A job that never started has no output file; its stdout is then the
reason it could not start.

    {"job_id", "attempt", "stream", "offset", "next_offset", "size", "data", "running"}

`data` is the bytes from `offset` (at most `limit`), decoded as UTF-8 with replacement;
a character cut by the end of the piece is left for the next one while more may come.
With no --error, a job's errors are in its output file, and its stderr stream is empty.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from agents import jobrecord
from agents.workspace import DEV_NULL, open_beneath

DEFAULT_LIMIT = 64 * 1024
MAX_LIMIT = 1024 * 1024
STREAMS = ("stdout", "stderr")


def newest_attempt(jobs_dir: Path, job_id: int) -> Path | None:
    best: tuple[int, Path] | None = None
    for jobdir in jobs_dir.glob(f"{int(job_id)}.*"):
        attempt = jobdir.name.split(".", 1)[1]
        if attempt.isdigit() and (best is None or int(attempt) > best[0]):
            best = (int(attempt), jobdir)
    return None if best is None else best[1]


def read_output(
    jobs_dir: Path, job_id: int, *, stream: str, offset: int, limit: int
) -> dict[str, Any] | None:
    """The piece of `stream` from `offset`; None when this agent never launched the job."""
    if stream not in STREAMS:
        raise ValueError(f"stream must be one of {', '.join(STREAMS)}")
    jobdir = newest_attempt(jobs_dir, job_id)
    if jobdir is None:
        return None
    record = jobrecord.read(jobdir, launch=False)
    running = record.exit is None
    data, size = _read(jobdir, record.run, stream, max(0, offset), max(0, min(limit, MAX_LIMIT)))
    if data and (running or offset + len(data) < size):
        data = data[: len(data) - _cut_character(data)]
    return {
        "job_id": job_id,
        "attempt": int(jobdir.name.split(".", 1)[1]),
        "stream": stream,
        "offset": offset,
        "next_offset": offset + len(data),
        "size": size,
        "data": data.decode("utf-8", errors="replace"),
        "running": running,
    }


def _read(
    jobdir: Path, run: dict[str, Any] | None, stream: str, offset: int, limit: int
) -> tuple[bytes, int]:
    fd = _open(jobdir, run, stream)
    if fd is None:
        return b"", 0
    try:
        size = os.fstat(fd).st_size
        data = os.pread(fd, min(limit, max(0, size - offset)), offset) if offset < size else b""
    finally:
        os.close(fd)
    return data, size


def _open(jobdir: Path, run: dict[str, Any] | None, stream: str) -> int | None:
    try:
        path = str((run or {}).get(stream) or "")
        if run is not None and path and path != DEV_NULL:
            return open_beneath(str(run["workspace"]), path)
    except (OSError, KeyError):
        pass
    if stream == "stdout":
        try:
            return os.open(jobdir / "launch-error", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
    return None


def _cut_character(data: bytes) -> int:
    """How many bytes at the end start a UTF-8 character the piece does not finish."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return 0
        if byte >= 0xC0:  # the first byte of a character of 2, 3 or 4 bytes
            needed = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return back if back < needed else 0
    return 0
