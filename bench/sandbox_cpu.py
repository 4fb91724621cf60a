"""The CPU one batch job's sandbox costs, all of it, for variants of its command line.

Each run is a `true` job as agents/launcher.py starts one: `Bubblewrap.wrap`'s command
line, run unprivileged as an organisation's identity, its first shell, then the script
(`#!/bin/sh`). Its CPU is read from a cgroup of its own, which also counts what no
parent reaps: bubblewrap's outer process exits before the sandbox's init has torn its
namespaces down, so the process tree misses about half of it (bench/agent_launch.py).
Variants run interleaved, ROUNDS rounds of PER runs each; the medians of the rounds are
printed. Root only (the identity, the cgroup).

    python bench/sandbox_cpu.py [--rounds 15] [--per 20] [VARIANT ...]

Variants:
    now          the command line as it is (the script, `#!/bin/sh`, run by the first
                 shell itself)
    exec         the first shell becoming the script (an exec), as it does for any other
                 interpreter
    mkdir        the job's own run directory made by bubblewrap (--dir), as a job's is
    premade      that directory made before the sandbox (as the job supervisor's child
                 once did, running Python between its fork and its exec)
    tools-copied srun and the Slurm commands copied in (--ro-bind-data, 11 links)
    tools-bound  the same, bound read-only from directories made once
    no-sys       without /sys (a floor, not a choice: GPU runtimes read it)
    sys-parts    /sys/devices, bus, class, dev and module bound one by one
    sys-first    /sys bound before the other mounts, not after them (each bind after it
                 reads its dozen mounts in the mount table again)
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from proctree import Cgroup  # noqa: E402

from agents import slurm_cli  # noqa: E402
from agents.identity import Identities, Identity  # noqa: E402
from agents.sandbox import (  # noqa: E402
    Bubblewrap,
    SandboxJob,
    data_fd,
    environment_fd,
    first_shell_command,
)

VARIANTS = (
    "now",
    "exec",
    "mkdir",
    "premade",
    "tools-copied",
    "tools-bound",
    "no-sys",
    "sys-parts",
    "sys-first",
)
SYS_PARTS = ("/sys/devices", "/sys/bus", "/sys/class", "/sys/dev", "/sys/module")
PR_SET_CHILD_SUBREAPER = 36


class Runs:
    def __init__(self, where: Path, identity: Identity, cgroup: Cgroup) -> None:
        self.identity, self.cgroup = identity, cgroup
        uid, gid = self.uid, self.gid = identity.uid, identity.gid
        self.workspace = where / "ws"
        (self.workspace / "jobs").mkdir(parents=True)
        for path in (self.workspace, self.workspace / "jobs"):
            os.chown(path, uid, gid)
        self.tools = slurm_cli.install_for_sandbox(where, "/run/spur/bin")
        self.sandbox = Bubblewrap()
        self.count = 0

    def one(self, variant: str) -> None:
        self.count += 1
        own = variant in ("mkdir", "premade")
        run_dir = self.workspace / "jobs" / str(self.count) if own else self.workspace
        files: list[tuple[int, str]] = []
        links: list[tuple[str, str]] = []
        if variant == "tools-copied":
            files = [(data_fd(c, "tool"), p) for c, p in slurm_cli.sandbox_files()]
            links = slurm_cli.sandbox_links("/run/spur/bin")
        script = data_fd(b"#!/bin/sh\ntrue\n", "script")
        env = environment_fd({"PATH": "/usr/bin:/bin", "HOME": str(self.workspace)})
        info_r, info_w = os.pipe()
        command = first_shell_command([], run_dir=str(run_dir), stdin="/dev/null",
                                      stdout=str(self.workspace / "out"), stderr="",
                                      in_shell=variant != "exec")  # fmt: skip
        job = SandboxJob(identity=self.identity, workspace=str(self.workspace), command=command,
                         env={}, script_fd=script, info_fd=info_w, block_fd=-1, files=files,
                         links=links, env_fd=env,
                         dirs=self.tools if variant == "tools-bound" else (),
                         make_dir=str(run_dir) if variant == "mkdir" else "")  # fmt: skip
        argv = self.sandbox.wrap(job)
        del argv[argv.index("--block-fd") : argv.index("--block-fd") + 2]
        if variant in ("no-sys", "sys-parts"):
            at = argv.index("/sys") - 1
            parts = [a for p in SYS_PARTS for a in ("--ro-bind", p, p) if os.path.isdir(p)]
            argv[at : at + 3] = parts if variant == "sys-parts" else []
        if variant == "sys-first":  # where it was bound until /sys went last
            at = argv.index("/sys") - 1
            sys_bind = argv[at : at + 3]
            del argv[at : at + 3]
            at = argv.index("--proc")
            argv[at:at] = sys_bind
        theirs = [script, env, info_w, *(fd for fd, _ in files)]
        process = subprocess.Popen(argv, pass_fds=theirs, preexec_fn=self._become(
            run_dir if variant == "premade" else None), env={}, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL)  # fmt: skip
        for fd in theirs:
            os.close(fd)
        info = b""
        while chunk := os.read(info_r, 4096):
            info += chunk
        os.close(info_r)
        if process.wait() != 0:
            raise RuntimeError(f"{variant}: the sandbox failed")
        # This process is a subreaper: the init is its own once bubblewrap's outer is
        # gone, and gone itself (its namespaces torn down) once waited for.
        with contextlib.suppress(ChildProcessError):
            os.waitpid(json.loads(info)["child-pid"], 0)

    def _become(self, make: Path | None) -> Callable[[], None]:
        def become() -> None:
            self.cgroup.add(os.getpid())
            os.setgroups([])
            os.setresgid(self.gid, self.gid, self.gid)
            os.setresuid(self.uid, self.uid, self.uid)
            if make is not None:
                os.mkdir(make)

        return become


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--per", type=int, default=20)
    parser.add_argument("variants", nargs="*", default=list(VARIANTS), help=", ".join(VARIANTS))
    args = parser.parse_args()
    if set(args.variants) - set(VARIANTS):
        parser.error(f"variants are {', '.join(VARIANTS)}")
    if os.geteuid() != 0:
        sys.exit("root only: the job's identity and a cgroup of its own")
    cgroup = Cgroup.made("spur-bench-sandbox")
    if cgroup is None:
        sys.exit("no cgroup to count the sandboxes in (cpuacct or cgroup2)")
    if ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sys.exit("cannot become a subreaper")
    identity = Identities().for_job(tenant="bench", user="bench")
    where = Path(tempfile.mkdtemp(prefix="spur-bench-sandbox-", dir="/tmp"))
    where.chmod(0o711)
    try:
        runs = Runs(where, identity, cgroup)
        per_round: dict[str, list[float]] = {v: [] for v in args.variants}
        for _ in range(args.rounds):
            for variant in args.variants:
                before = cgroup.cpu_seconds()
                for _ in range(args.per):
                    runs.one(variant)
                per_round[variant].append((cgroup.cpu_seconds() - before) * 1000 / args.per)
    finally:
        shutil.rmtree(where, ignore_errors=True)
        cgroup.remove()
    print(f"CPU a sandbox (ms), {args.rounds} rounds of {args.per}, {os.cpu_count()} CPUs")
    print(f"{'variant':<14}{'median':>9}{'min':>9}{'max':>9}")
    for variant, values in per_round.items():
        row = (statistics.median(values), min(values), max(values))
        print(f"{variant:<14}" + "".join(f"{v:>9.2f}" for v in row))
    print(json.dumps({"bench": "sandbox_cpu", **{v: round(statistics.median(x), 2)
                      for v, x in per_round.items()}}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
