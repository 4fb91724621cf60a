"""`srun`: run a job step, one task per rank, on the nodes of an allocation.

    srun [-n N] [-N N] [--ntasks-per-node N] [-c N] [--gpus-per-task N] [-l]
         [-o PATTERN] [-e PATTERN] [--export ALL|NONE|VARS] [-u] [--mpi=none]
         [--cpu-bind=none|cores] command [args...]

Inside an allocation (`SLURM_JOB_ID` set) it asks the controller for a step with the
job's step credential (`SPUR_STEP_TOKEN`, put in the job's environment by its agent),
gets back one launch per node signed by the controller, sends each to its node's agent
and prints the tasks' output as the agents stream it (docs/architecture.md, "Job
steps"). Its exit code is the highest of its tasks', or 128+n for a task ended by
signal n (srun(1), RETURN VALUE).

Outside an allocation it first asks the web API for one (like `salloc`), runs the step
in it, and gives it back.

This module is also the step client inside every job's sandbox (`/run/spur/bin/srun`,
agents/steps.py): it needs nothing but Python's standard library, and imports nothing
of the platform unless it must make an allocation.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import signal as signals
import sys
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import IO, Any

PROG = "srun"
USAGE = """\
Usage: srun [-N nnodes] [-n ntasks] [--ntasks-per-node=n] [-c ncpus]
            [--gpus-per-task=n] [-l] [-o out] [-e err] [-i in] [-u]
            [--export=ALL|NONE|vars] [--mpi=none] [--cpu-bind=none|cores]
            [-p partition] [-t time] [--gres=list] [-G gpus] [-J name]
            executable [args...]
"""
TIMEOUT_S = 30.0

# option -> (destination, takes a value)
_LONG: dict[str, tuple[str, bool]] = {
    "ntasks": ("ntasks", True),
    "nodes": ("nodes", True),
    "ntasks-per-node": ("ntasks_per_node", True),
    "cpus-per-task": ("cpus_per_task", True),
    "gpus-per-task": ("gpus_per_task", True),
    "label": ("label", False),
    "output": ("output", True),
    "error": ("error", True),
    "input": ("input", True),
    "export": ("export", True),
    "unbuffered": ("unbuffered", False),
    "mpi": ("mpi", True),
    "cpu-bind": ("cpu_bind", True),
    "cpu_bind": ("cpu_bind", True),
    "job-name": ("name", True),
    "chdir": ("chdir", True),
    "partition": ("partition", True),
    "time": ("time", True),
    "gres": ("gres", True),
    "gpus": ("gpus", True),
    "gpus-per-node": ("gpus_per_node", True),
    "mem": ("mem", True),
    "account": ("account", True),
    "qos": ("qos", True),
    "constraint": ("constraint", True),
    "nodelist": ("nodelist", True),
    "exclude": ("exclude", True),
    "exclusive": ("exclusive", False),
    "pty": ("pty", False),
    "quiet": ("quiet", False),
    "verbose": ("verbose", False),
    "help": ("help", False),
    "usage": ("usage", False),
    "version": ("version", False),
}
_SHORT: dict[str, str] = {
    "n": "ntasks",
    "N": "nodes",
    "c": "cpus-per-task",
    "l": "label",
    "o": "output",
    "e": "error",
    "i": "input",
    "u": "unbuffered",
    "J": "job-name",
    "D": "chdir",
    "p": "partition",
    "t": "time",
    "G": "gpus",
    "A": "account",
    "q": "qos",
    "C": "constraint",
    "w": "nodelist",
    "x": "exclude",
    "Q": "quiet",
    "v": "verbose",
    "h": "help",
    "V": "version",
}
_COUNTS = ("ntasks", "nodes", "ntasks_per_node", "cpus_per_task", "gpus_per_task")
# What an allocation is asked for with (outside one): the same words as sbatch's.
ALLOCATION_OPTIONS = (
    "partition",
    "time",
    "gres",
    "gpus",
    "gpus_per_node",
    "mem",
    "account",
    "qos",
    "constraint",
    "nodelist",
    "exclude",
    "exclusive",
)


class Usage(Exception):
    """A bad command line: getopt's own complaints exit 255, as Slurm's do."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Options:
    values: dict[str, Any] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)


def parse(args: list[str]) -> Options:
    """srun's command line, getopt style: options up to the first word that is not one
    (or `--`), then the command and its arguments untouched."""
    opts = Options()
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            i += 1
            break
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            matches = [k for k in _LONG if k == name] or [k for k in _LONG if k.startswith(name)]
            if len(matches) != 1:
                raise Usage(f"{PROG}: unrecognized option '{arg}'\n" + _TRY, 255)
            dest, takes = _LONG[matches[0]]
            if takes and not eq:
                i += 1
                if i >= len(args):
                    raise Usage(
                        f"{PROG}: option '--{matches[0]}' requires an argument\n" + _TRY, 255
                    )
                value = args[i]
            elif not takes and eq:
                raise Usage(
                    f"{PROG}: option '--{matches[0]}' doesn't allow an argument\n" + _TRY, 255
                )
            _set(opts, dest, value if takes else True)
        elif arg.startswith("-") and len(arg) > 1:
            j = 1
            while j < len(arg):
                letter = arg[j]
                if letter not in _SHORT:
                    raise Usage(f"{PROG}: invalid option -- '{letter}'\n" + _TRY, 255)
                dest, takes = _LONG[_SHORT[letter]]
                if takes:
                    value = arg[j + 1 :]
                    if not value:
                        i += 1
                        if i >= len(args):
                            raise Usage(
                                f"{PROG}: option requires an argument -- '{letter}'\n" + _TRY,
                                255,
                            )
                        value = args[i]
                    _set(opts, dest, value)
                    break
                _set(opts, dest, True)
                j += 1
        else:
            break
        i += 1
    opts.argv = args[i:]
    return opts


_TRY = f'Try "{PROG} --help" for more information'


def _set(opts: Options, dest: str, value: Any) -> None:
    if dest in _COUNTS:
        text = str(value)
        if dest == "nodes" and "-" in text:  # -N min-max: the minimum is what we hold to
            text = text.split("-", 1)[0]
        # -N 0 is a count: the controller refuses it, in Slurm's words.
        if not text.isdigit() or int(text) < (0 if dest in ("gpus_per_task", "nodes") else 1):
            label = dest.replace("_", "-")
            raise Usage(f'{PROG}: error: Invalid numeric value "{value}" for --{label}.')
        value = int(text)
    if dest == "cpu_bind":
        kind = str(value).split(",")[-1].split(":")[0]
        if kind not in ("none", "no", "cores", "threads", "sockets", "ldoms", "rank",
                        "map_cpu", "mask_cpu", "verbose", "quiet"):  # fmt: skip
            raise Usage(f"{PROG}: error: Invalid --cpu-bind argument: {value}")
    if dest == "mpi" and str(value) not in ("none", "pmi2", "pmix", "list"):
        opts.warnings.append(f"{PROG}: warning: --mpi={value} is not supported: using none")
    if dest == "pty":
        opts.warnings.append(f"{PROG}: warning: --pty is not supported: running without one")
    opts.values[dest] = value


def export_environment(spec: str | None, environ: dict[str, str]) -> dict[str, str]:
    """--export: ALL (the default), NONE, or [ALL,]VAR[=value],..."""
    if spec is None or spec.upper() == "ALL":
        return dict(environ)
    if spec.upper() == "NONE":
        return {}
    chosen: dict[str, str] = {}
    for word in (w for w in spec.split(",") if w):
        if word.upper() == "ALL":
            chosen.update(environ)
        elif "=" in word:
            key, _, value = word.partition("=")
            chosen[key] = value
        elif word in environ:
            chosen[word] = environ[word]
    return chosen


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


# -- talking to the controller and the agents --------------------------------------------


class Failed(Exception):
    pass


def _request(url: str, body: dict[str, Any], token: str | None) -> Any:
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST")
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    return urllib.request.urlopen(request, timeout=TIMEOUT_S)  # noqa: S310 (our URLs)


def _detail(exc: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(exc.read() or b"{}").get("detail") or exc.reason)
    except ValueError:
        return str(exc.reason)


def controller_call(urls: list[str], path: str, body: dict[str, Any], token: str) -> Any:
    """POST to the first controller replica that answers (any replica takes it)."""
    last = "no controller URL (SPUR_STEP_URL)"
    for base in urls:
        try:
            with _request(base.rstrip("/") + path, body, token) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            if exc.code in (502, 503, 504):
                last = _detail(exc)
                continue
            raise Failed(_detail(exc)) from None
        except (OSError, ValueError) as exc:
            last = str(exc)
    raise Failed(f"Unable to contact the controller: {last}")


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


def step_request(opts: Options) -> dict[str, Any]:
    """What the step asks for: the command, its environment (--export), its tasks."""
    cwd = opts.get("chdir") or os.getcwd()
    body: dict[str, Any] = {
        "argv": opts.argv,
        "env": export_environment(opts.get("export"), dict(os.environ)),
        "cwd": cwd,
        "name": opts.get("name") or os.path.basename(opts.argv[0]),
    }
    for key in _COUNTS:
        if opts.get(key) is not None:
            body[key] = opts.get(key)
    if opts.get("cpu_bind"):
        kind = str(opts.get("cpu_bind")).split(",")[-1].split(":")[0]
        body["cpu_bind"] = "none" if kind in ("none", "no") else "cores"
        body["env"]["SLURM_CPU_BIND"] = str(opts.get("cpu_bind"))
    if opts.get("label"):
        body["env"]["SLURM_LABELIO"] = "1"
    if opts.get("unbuffered"):
        body["env"]["SLURM_UNBUFFEREDIO"] = "1"
    data = read_stdin(opts.get("input"))
    if data:
        body["stdin"] = base64.b64encode(data).decode()
    return body


MAX_STDIN = 1024 * 1024


def read_stdin(mode: str | None) -> bytes:
    """What task 0 reads on its stdin: srun's own stdin, read to its end before the step
    starts (at most MAX_STDIN bytes), unless it is a terminal or `-i none`."""
    if mode is not None and str(mode) not in ("0", "all"):
        return b""
    try:
        if os.isatty(0):
            return b""
        data = os.read(0, MAX_STDIN + 1)
        chunks = [data]
        total = len(data)
        while data and total <= MAX_STDIN:
            data = os.read(0, MAX_STDIN + 1 - total)
            chunks.append(data)
            total += len(data)
    except OSError:
        return b""
    if total > MAX_STDIN:
        raise Failed(f"the standard input of a step is limited to {MAX_STDIN} bytes")
    return b"".join(chunks)


Event = tuple[str, dict[str, Any]] | None


@dataclass
class StepStream:
    """A started step: which node runs which rank, and its events as they come, from
    `sources` streams (each ends with None)."""

    step_id: int
    rank_node: dict[int, str]
    node_ids: dict[str, int]
    events: queue.Queue[Event]
    sources: int
    record_end: bool  # srun tells the controller how the step ended (inside a job)


def _pump(events: queue.Queue[Event], node: str, url: str, body: dict[str, Any],
          token: str | None, skip_first: bool = False) -> None:  # fmt: skip
    try:
        with _request(url, body, token) as response:
            for i, raw in enumerate(response):
                if skip_first and i == 0:
                    continue
                event = json.loads(raw)
                events.put((str(event.pop("node", node)), event))
    except urllib.error.HTTPError as exc:
        events.put((node, {"error": _detail(exc)}))
    except (OSError, ValueError) as exc:
        events.put((node, {"error": f"lost the connection to {node}: {exc}"}))
    finally:
        events.put(None)


def open_in_job(job_id: str, body: dict[str, Any], *, token: str, urls: list[str]) -> StepStream:
    """Inside a job: the controller creates the step and signs its launches; srun sends
    each to its node's agent and reads the tasks' output from it."""
    answer = controller_call(urls, f"/v1/jobs/{job_id}/steps", body, token)
    launches = answer["launches"]
    events: queue.Queue[Event] = queue.Queue()
    stream = StepStream(
        step_id=int(answer["step_id"]),
        rank_node={
            int(task[0]): launch["node"]
            for launch in launches
            for task in launch["payload"]["step"]["tasks"]
        },
        node_ids={launch["node"]: i for i, launch in enumerate(launches)},
        events=events,
        sources=len(launches),
        record_end=True,
    )
    for launch in launches:
        url = f"{launch['agent_url'].rstrip('/')}/v1/jobs/{job_id}/steps"
        threading.Thread(
            target=_pump, args=(events, launch["node"], url, launch["payload"], None), daemon=True
        ).start()
    return stream


def open_through_web(job_id: str, body: dict[str, Any], *, api_url: str, token: str) -> StepStream:
    """Outside the job's sandbox (salloc's command, srun outside an allocation): the web
    API creates the step for the job's owner and relays its tasks' output."""
    url = f"{api_url.rstrip('/')}/api/v1/jobs/{job_id}/steps"
    try:
        response = _request(url, body, token)
    except urllib.error.HTTPError as exc:
        raise Failed(_detail(exc)) from None
    except OSError as exc:
        raise Failed(f"cannot reach the Spur API at {api_url}: {exc}") from None
    first = json.loads(response.readline() or b"{}")
    events: queue.Queue[Event] = queue.Queue()

    def relay() -> None:
        try:
            for raw in response:
                event = json.loads(raw)
                events.put((str(event.pop("node", "")), event))
        except (OSError, ValueError) as exc:
            events.put(("", {"error": f"lost the connection to the Spur API: {exc}"}))
        finally:
            response.close()
            events.put(None)

    threading.Thread(target=relay, daemon=True).start()
    nodes = [str(n) for n in first.get("nodes", [])]
    return StepStream(
        step_id=int(first["step_id"]),
        rank_node={int(rank): str(node) for rank, node in first.get("tasks", [])},
        node_ids={n: i for i, n in enumerate(nodes)},
        events=events,
        sources=1,
        record_end=False,
    )


def run_step(opts: Options, job_id: str, stream: StepStream, *, token: str = "",
             urls: list[str] | None = None) -> int:  # fmt: skip
    """Print the step's output as srun does, and answer its exit code."""
    cwd = opts.get("chdir") or os.getcwd()
    step_id, rank_node, node_ids = stream.step_id, stream.rank_node, stream.node_ids
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
    exits: dict[int, tuple[int, int]] = {}
    errors = []
    running = stream.sources
    while running:
        item = stream.events.get()
        if item is None:
            running -= 1
            continue
        node, event = item
        if "error" in event:
            errors.append((node, str(event["error"])))
            continue
        rank = int(event["t"])
        for key in ("o", "e"):
            if key in event and (rank, key) in sinks:
                sinks[(rank, key)].write(rank, base64.b64decode(event[key]))
        if "x" in event:
            exits[rank] = (int(event["x"]), int(event.get("s") or 0))
    for (rank, _), sink in sinks.items():
        sink.finish(rank)
    for handle in files.values():
        handle.close()
    for node, message in errors:
        print(f"{PROG}: error: {node + ': ' if node else ''}{message}", file=sys.stderr)
    code = 0
    worst_signal = 0
    for rank in sorted(rank_node):
        exit_code, signum = exits.get(rank, (1, 0) if errors else (0, signals.SIGKILL))
        where = f"{rank_node[rank]}: task {rank}"
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
    if stream.record_end:
        try:
            controller_call(
                urls or [],
                f"/v1/jobs/{job_id}/steps/{step_id}/finished",
                {"exit_code": 0 if worst_signal else min(code, 255), "signal": worst_signal},
                token,
            )
        except Failed as exc:
            print(f"{PROG}: warning: the end of step {job_id}.{step_id} was not recorded: {exc}",
                  file=sys.stderr)  # fmt: skip
    return min(code, 255)


_SIGNALS = {int(s) for s in signals.Signals}


def _signal_words(name: str) -> str:
    return {"SIGKILL": "Killed", "SIGTERM": "Terminated", "SIGSEGV": "Segmentation fault"}.get(
        name, name
    )


def web_config() -> tuple[str, str]:
    """The web API's URL and the user's token (salloc's command, a login node)."""
    url, token = os.environ.get("SPUR_API_URL", ""), os.environ.get("SPUR_TOKEN", "")
    if url and token:
        return url, token
    try:
        from scheduler.cli.config import ConfigMissing, load_config
    except ImportError:  # the step client inside a job's sandbox: no platform package
        raise Failed(
            f"job {os.environ.get('SLURM_JOB_ID')}: no step credential in this environment "
            "(SPUR_STEP_TOKEN, SPUR_STEP_URL): srun runs steps inside a Spur job"
        ) from None
    try:
        config = load_config(None)
    except ConfigMissing as exc:
        raise Failed(str(exc)) from None
    return config.api_url, config.token


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        opts = parse(args)
    except Usage as exc:
        print(str(exc), file=sys.stderr)
        return exc.code
    if opts.get("version"):
        print("slurm 22.05.8")
        return 0
    if opts.get("help") or opts.get("usage"):
        print(USAGE.rstrip("\n"))
        return 0
    for warning in opts.warnings:
        print(warning, file=sys.stderr)
    if not opts.argv:
        print(f"{PROG}: fatal: No command given to execute.", file=sys.stderr)
        return 1
    job_id = os.environ.get("SLURM_JOB_ID") or os.environ.get("SLURM_JOBID")
    try:
        if job_id:
            token = os.environ.get("SPUR_STEP_TOKEN", "")
            urls = [u for u in os.environ.get("SPUR_STEP_URL", "").split(",") if u]
            if token and urls:  # inside the job's sandbox
                stream = open_in_job(job_id, step_request(opts), token=token, urls=urls)
                return run_step(opts, job_id, stream, token=token, urls=urls)
            api_url, api_token = web_config()
            stream = open_through_web(job_id, step_request(opts), api_url=api_url, token=api_token)
            return run_step(opts, job_id, stream)
        from scheduler.cli.salloc import allocate_and_run

        return allocate_and_run(PROG, opts, step=True)
    except Failed as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
