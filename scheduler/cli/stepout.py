"""How srun shows a running step (scheduler/cli/srun.py starts it, scheduler/cli/stepio.py
carries it): each task's output to srun's stdout and stderr or to `-o`/`-e` files
(`%t` a file per task), labelled with `-l`; its input to the tasks that read it (`-i`);
its terminal (`--pty`); and, once every task has ended, srun's words for how each ended
and its exit code: the highest of its tasks', or 128+n for a task ended by signal n
(srun(1), RETURN VALUE).
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal as signals
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

from scheduler.cli import stepio

PROG = "srun"


def expand(pattern: str, *, job_id: str, step_id: int, rank: int | None, node: str,
           node_id: int) -> str:  # fmt: skip
    """srun's output filename pattern: %j %J %s %t %n %N %u %%, with zero padding (%4t)."""
    out = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            out.append(pattern[i + 1])
            i += 2
            continue
        if ch != "%" or i + 1 >= len(pattern):
            out.append(ch)
            i += 1
            continue
        j = i + 1
        while j < len(pattern) and pattern[j].isdigit():
            j += 1
        width = int(pattern[i + 1 : j] or 0)
        key = pattern[j] if j < len(pattern) else ""
        values = {
            "j": job_id,
            "J": f"{job_id}.{step_id}",
            "s": str(step_id),
            "t": "" if rank is None else str(rank),
            "n": str(node_id),
            "N": node,
            "u": os.environ.get("USER", ""),
            "%": "%",
        }
        if key in values:
            value = values[key]
            out.append(value.zfill(width) if value.isdigit() else value)
            i = j + 1
        else:
            out.append(pattern[i : j + 1])
            i = j + 1
    return "".join(out)


def per_task(pattern: str | None) -> bool:
    return bool(pattern) and "%t" in str(pattern).replace("%%", "")


@dataclass
class _Sink:
    """Where a stream of the step goes: srun's own stdout/stderr, or a file."""

    handle: IO[bytes]
    label: bool
    width: int
    pending: dict[int, bytearray] = field(default_factory=dict)

    def write(self, rank: int, data: bytes) -> None:
        if not self.label:
            self.handle.write(data)
            self.handle.flush()
            return
        buf = self.pending.setdefault(rank, bytearray())
        buf += data
        *lines, rest = bytes(buf).split(b"\n")
        self.pending[rank] = bytearray(rest)
        for line in lines:
            self.handle.write(f"{rank:>{self.width}}: ".encode() + line + b"\n")
        self.handle.flush()

    def finish(self, rank: int) -> None:
        rest = self.pending.pop(rank, None)
        if rest:  # a last line without its newline: labelled all the same
            self.write(rank, bytes(rest) + b"\n")


def input_mode(given: str | None) -> str | int:
    """-i: "all" (Slurm's default: every task reads srun's input), "none", a task's rank,
    or a file srun reads and sends to every task."""
    if given is None or given in ("all", "none"):
        return given or "all"
    if given.isdigit():
        return int(given)
    return "all"


def run_step(opts: Any, job_id: str, step: stepio.Step, *,
             record: Callable[[dict[str, int]], None] | None = None,
             source: int | None = 0) -> int:  # fmt: skip
    """Print the step's output as srun does, feed it its input, and answer its exit code.
    `source`: where its input comes from (None: nothing is read); `record`: how srun
    tells the controller how the step ended (inside a job)."""
    cwd = opts.get("chdir") or os.getcwd()
    step_id, rank_node = step.step_id, step.rank_node
    node_ids = {link.node: i for i, link in enumerate(step.links)}
    width = len(str(max(len(rank_node) - 1, 0)))
    label = bool(opts.get("label"))
    files: dict[str, IO[bytes]] = {}

    def sink_for(pattern: str, rank: int) -> _Sink:
        node = rank_node[rank]
        path = expand(str(pattern), job_id=job_id, step_id=step_id,
                      rank=rank if per_task(pattern) else None, node=node,
                      node_id=node_ids.get(node, 0))  # fmt: skip
        path = os.path.join(cwd, path)
        if path not in files:
            files[path] = open(path, "ab")  # noqa: SIM115 (closed below)
        return _Sink(files[path], label, width)

    out_pattern, err_pattern = opts.get("output"), opts.get("error") or opts.get("output")
    sinks: dict[tuple[int, str], _Sink] = {}
    shared_out = _Sink(sys.stdout.buffer, label, width)
    shared_err = _Sink(sys.stderr.buffer, label, width)
    for rank in rank_node:
        sinks[(rank, "o")] = sink_for(out_pattern, rank) if out_pattern else shared_out
        sinks[(rank, "e")] = sink_for(err_pattern, rank) if err_pattern else shared_err
    terminal = step.by_node.get(rank_node.get(0, "")) if opts.get("pty") else None
    readers = _input_links(step, opts)
    if source is not None and readers:
        threading.Thread(target=stepio.pump_input, args=(step, source, readers),
                         kwargs={"close": source != 0}, daemon=True).start()  # fmt: skip
    errors: list[tuple[str, str]] = []
    with contextlib.ExitStack() as scope:
        scope.enter_context(stepio.Forwarder(step))
        if terminal is not None:
            scope.enter_context(stepio.RawTerminal(0))
            scope.enter_context(stepio.WindowFollower(step, terminal, 1))
        _print_events(step, sinks, errors)
    for (rank, _), sink in sinks.items():
        sink.finish(rank)
    for handle in files.values():
        handle.close()
    return _step_end(step, errors, record)


def _input_links(step: stepio.Step, opts: Any) -> list[stepio.Link]:
    """The nodes of the tasks that read srun's input."""
    mode = input_mode(opts.get("input"))
    if opts.get("pty"):
        mode = 0
    if mode == "none":
        return []
    if isinstance(mode, int):
        node = step.rank_node.get(mode)
        return [step.by_node[node]] if node is not None else []
    return list(step.links)


def _print_events(step: stepio.Step, sinks: dict[tuple[int, str], _Sink],
                  errors: list[tuple[str, str]]) -> None:  # fmt: skip
    while True:
        try:
            item = step.events.get(timeout=0.5)
        except queue.Empty:
            continue
        if item is None:
            if step.ended_reader():
                return
            continue
        node, event = item
        if "error" in event:
            errors.append((node, str(event["error"])))
            continue
        rank = int(event["t"])
        if "lost" in event:
            print(f"{PROG}: error: {node}: task {rank}: {event['lost']} bytes of its output "
                  "were lost", file=sys.stderr)  # fmt: skip
        for key in ("o", "e"):
            if key in event and (rank, key) in sinks:
                sinks[(rank, key)].write(rank, event[key])


def _step_end(step: stepio.Step, errors: list[tuple[str, str]],
              record: Callable[[dict[str, int]], None] | None) -> int:  # fmt: skip
    for node, message in errors:
        print(f"{PROG}: error: {node + ': ' if node else ''}{message}", file=sys.stderr)
    code = 0
    worst_signal = 0
    exits = {rank: status for link in step.links for rank, status in link.exits.items()}
    for rank, node in sorted(step.rank_node.items()):
        exit_code, signum = exits.get(rank, (1, 0) if errors else (0, signals.SIGKILL))
        where = f"{node}: task {rank}"
        if signum:
            name = signals.Signals(signum).name if signum in _SIGNALS else str(signum)
            print(f"{PROG}: error: {where}: {_signal_words(name)}", file=sys.stderr)
            code = max(code, 128 + signum)
            worst_signal = max(worst_signal, signum)
        elif exit_code:
            print(f"{PROG}: error: {where}: Exited with exit code {exit_code}", file=sys.stderr)
            code = max(code, exit_code)
    if errors and not code:
        code = 1
    ended = {"exit_code": 0 if worst_signal else min(code, 255), "signal": worst_signal}
    try:
        if record is not None:
            record(ended)
        elif step.reattached:
            step.transport.record_end(ended["exit_code"], ended["signal"])
    except Exception as exc:  # srun's Failed, a transport's Retry or Fatal
        print(f"{PROG}: warning: the end of step {step.job_id}.{step.step_id} was not "
              f"recorded: {exc}", file=sys.stderr)  # fmt: skip
    return min(code, 255)


_SIGNALS = {int(s) for s in signals.Signals}


def _signal_words(name: str) -> str:
    return {"SIGKILL": "Killed", "SIGTERM": "Terminated", "SIGSEGV": "Segmentation fault"}.get(
        name, name
    )


__all__ = ["expand", "input_mode", "per_task", "run_step"]
