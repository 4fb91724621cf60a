"""`srun`: run a job step, one task per rank, on the nodes of an allocation.

    srun [-n N] [-N N] [--ntasks-per-node N] [-c N] [--gpus-per-task N] [-l]
         [-o PATTERN] [-e PATTERN] [-i all|none|N|FILE] [--pty] [--export ALL|NONE|VARS]
         [-u] [--mpi=none] [--cpu-bind=none|cores] command [args...]

Inside an allocation (`SLURM_JOB_ID` set) it asks the controller for a step with the
job's step credential (`SPUR_STEP_TOKEN`, put in the job's environment by its agent),
gets back one launch per node signed by the controller (and the step's I/O credential
there), sends each to its node's agent and follows the node's stream
(scheduler/cli/stepio.py), printing the tasks' output as it comes, feeding them its
input, and reconnecting where it stopped when a stream breaks (docs/architecture.md,
"Job steps"); scheduler/cli/stepout.py prints it and answers its exit code. Outside the
job's sandbox (salloc's command) the web API carries all of it.

Outside an allocation it first asks the web API for one (like `salloc`), runs the step
in it, and gives it back.

Inside every job's sandbox this is `/run/spur/bin/srun`, run from the CLI bundle
(agents/slurm_cli.py): it needs nothing but Python's standard library, and imports
nothing of the platform unless it must make an allocation.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from scheduler.cli import stepio
from scheduler.cli.stepout import input_mode, run_step

PROG = "srun"
USAGE = """\
Usage: srun [-N nnodes] [-n ntasks] [--ntasks-per-node=n] [-c ncpus]
            [--gpus-per-task=n] [-l] [-o out] [-e err] [-i in] [-u]
            [--export=ALL|NONE|vars] [--mpi=none] [--cpu-bind=none|cores]
            [-p partition] [-t time] [--gres=list] [-G gpus] [-J name]
            executable [args...]
"""
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


# -- talking to the controller and the agents --------------------------------------------


class Failed(Exception):
    pass


def controller_call(urls: list[str], path: str, body: dict[str, Any], *, token: str) -> Any:
    """POST to the first controller replica that answers (any replica takes it)."""
    last = "no controller URL (SPUR_STEP_URL)"
    for base in urls:
        try:
            return stepio.call(base.rstrip("/") + path, body, token)
        except stepio.Retry as exc:
            last = str(exc)
        except stepio.Fatal as exc:
            raise Failed(str(exc)) from None
    raise Failed(f"Unable to contact the controller: {last}")


def step_request(opts: Options) -> dict[str, Any]:
    """What the step asks for: the command, its environment (--export), its tasks, who
    reads srun's input (-i) and task 0's terminal (--pty)."""
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
    if opts.get("unbuffered") or opts.get("pty"):  # --pty: --unbuffered, implicitly
        body["env"]["SLURM_UNBUFFEREDIO"] = "1"
    body["input"] = input_mode(opts.get("input"))
    if opts.get("pty"):
        body["pty"] = list(opts.values["pty_size"])
    return body


def input_source(opts: Options) -> int | None:
    """The descriptor srun reads the tasks' input from: its stdin, or -i's file; None
    with `-i none`. A file that cannot be opened is refused as Slurm refuses it."""
    given = opts.get("input")
    if given == "none":
        return None
    if given is None or given == "all" or str(given).isdigit():
        return 0
    path = os.path.join(opts.get("chdir") or os.getcwd(), str(given))
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise Failed(f"Could not open stdin file: {exc.strerror}") from None


def open_in_job(job_id: str, body: dict[str, Any], *, token: str, urls: list[str],
                verbose: bool = False) -> stepio.Step:  # fmt: skip
    """Inside a job: the controller creates the step and signs its launches; srun sends
    each to its node's agent and follows the node's stream from its answer on."""
    answer = controller_call(urls, f"/v1/jobs/{job_id}/steps", body, token=token)
    launches = answer["launches"]
    links = [
        stepio.Link(
            launch["node"], [int(t[0]) for t in launch["payload"]["step"]["tasks"]], launch["io"]
        )
        for launch in launches
    ]
    agents = {launch["node"]: launch["agent_url"] for launch in launches}
    step_id = int(answer["step_id"])
    step = stepio.Step(job_id, step_id, links, stepio.Direct(job_id, step_id, agents),
                       record_end=True, verbose=verbose)  # fmt: skip
    for link, launch in zip(links, launches, strict=True):
        url = f"{launch['agent_url'].rstrip('/')}/v1/jobs/{job_id}/steps"
        opener = functools.partial(stepio.post, url, launch["payload"], None,
                                   timeout=stepio.STREAM_TIMEOUT_S)  # fmt: skip
        step.spawn(step.follow, link, opener)
    return step


def open_through_web(job_id: str, body: dict[str, Any], *, api_url: str, token: str,
                     verbose: bool = False) -> stepio.Step:  # fmt: skip
    """Outside the job's sandbox (salloc's command, srun outside an allocation): the web
    API creates the step for the job's owner and relays its tasks' output."""
    url = f"{api_url.rstrip('/')}/api/v1/jobs/{job_id}/steps"
    try:
        response = stepio.post(url, body, token, timeout=stepio.STREAM_TIMEOUT_S)
        first = json.loads(response.readline() or b"{}")
    except stepio.Fatal as exc:
        raise Failed(str(exc)) from None
    except (stepio.Retry, OSError, ValueError) as exc:
        raise Failed(f"cannot reach the Spur API at {api_url}: {exc}") from None
    ranks: dict[str, list[int]] = {str(n): [] for n in first.get("nodes", [])}
    for rank, node in first.get("tasks", []):
        ranks.setdefault(str(node), []).append(int(rank))
    io = first.get("io", {})
    links = [stepio.Link(node, found, str(io.get(node, ""))) for node, found in ranks.items()]
    step_id = int(first["step_id"])
    transport = stepio.ViaWeb(job_id, step_id, api_url, token)
    step = stepio.Step(job_id, step_id, links, transport, record_end=False, verbose=verbose)
    step.spawn(step.follow_web, response)
    return step


def web_config() -> tuple[str, str]:
    """The web API's URL and the user's token (salloc's command, a login node; inside a
    job without its step credential, the submitter's, if it exported them)."""
    url, token = os.environ.get("SPUR_API_URL", ""), os.environ.get("SPUR_TOKEN", "")
    if url and token:
        return url, token
    from scheduler.cli.config import ConfigMissing, load_config

    try:
        config = load_config(None)
    except ConfigMissing as exc:
        raise Failed(str(exc)) from None
    return config.api_url, config.token


def _terminal(opts: Options) -> bool:
    """Whether --pty can have its terminal: srun's stdout is one, whose size task 0's
    starts with. Slurm's words when it is not, and then it runs without one."""
    size = stepio.window_size(1)
    if size is None:
        print(f"{PROG}: error: ioctl(TIOCGWINSZ): Inappropriate ioctl for device",
              file=sys.stderr)  # fmt: skip
        print(f"{PROG}: error: Not using a pseudo-terminal, disregarding --pty option",
              file=sys.stderr)  # fmt: skip
        return False
    opts.values["pty_size"] = size
    return True


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
    if opts.get("pty") and any(opts.get(k) for k in ("error", "input", "output")):
        print(f"{PROG}: error: --error/--input/--output are incompatible with --pty",
              file=sys.stderr)  # fmt: skip
        return 1
    if opts.get("pty") and not _terminal(opts):
        opts.values.pop("pty")
    job_id = os.environ.get("SLURM_JOB_ID") or os.environ.get("SLURM_JOBID")
    verbose = bool(opts.get("verbose"))
    try:
        source = input_source(opts)
        if job_id:
            token = os.environ.get("SPUR_STEP_TOKEN", "")
            urls = [u for u in os.environ.get("SPUR_STEP_URL", "").split(",") if u]
            if token and urls:  # inside the job's sandbox
                step = open_in_job(job_id, step_request(opts), token=token, urls=urls,
                                   verbose=verbose)  # fmt: skip
                path = f"/v1/jobs/{job_id}/steps/{step.step_id}/finished"
                record = functools.partial(controller_call, urls, path, token=token)
                return run_step(opts, job_id, step, record=record, source=source)
            api_url, api_token = web_config()
            step = open_through_web(job_id, step_request(opts), api_url=api_url,
                                    token=api_token, verbose=verbose)  # fmt: skip
            return run_step(opts, job_id, step, source=source)
        from scheduler.cli.salloc import allocate_and_run

        return allocate_and_run(PROG, opts, step=True)
    except Failed as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


script = main  # its console script: it may leave threads to finish, so it returns


if __name__ == "__main__":
    raise SystemExit(main())
