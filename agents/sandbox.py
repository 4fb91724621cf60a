"""The sandbox a job runs in: what of the host it sees, and its first shell.

`Sandbox` is the seam: given one job (its identity, workspace, command, environment,
script and devices) it answers the command line that runs the job contained. The agent
executes that command line as the job's identity, never as itself or root, with an
empty environment. `Bubblewrap` is the implementation today; a container runtime
(podman or apptainer with the agent's CDI spec) is another one to come, and must keep
the same two promises to the launcher: write `{"child-pid": <pid>}` (the init of the
job's PID namespace, as the host numbers it) to `info_fd`, and start nothing of the job
before a byte arrives on `block_fd`, so the launcher can bind CPUs and place cgroups
first.

A `Bubblewrap` sandbox is made unprivileged (bwrap creates a user namespace, the kernel
checks everything as the job's uid) with its own mount, PID, IPC and cgroup namespaces,
and the host's network. Inside it there is:

    /usr /bin /sbin /lib* /etc /opt   the host's, read-only (a symlinked /bin stays one)
    /sys                              read-only: GPU runtimes read the devices' topology
                                      there (ROCr's /sys/class/kfd, NVML's PCI tree)
    /proc                             of the sandbox's own PID namespace
    /dev                              a minimal one (null, zero, random, tty, shm, pts),
                                      plus the device nodes of this job's GPUs only
    /tmp                              empty and private (tmpfs)
    {work_root}/{tenant}              the organisation's workspace, read-write, at its path
    /run/spur/job/script              a read-only copy of the batch script
    /run/spur/bin/srun                the step client (scheduler/cli/srun.py), read-only
    /run/spur/bin/sbatch squeue ...   the Slurm commands: links to their dispatcher,
    /run/spur/lib/slurm-cli(.pyz)     read-only, and the commands (agents/slurm_cli.py;
                                      both directories bound from the work root's
                                      .spur-tools-*, root's and read-only)
    sandbox_binds                     what a site asks for (site tenancy: /home, /scratch)

and nothing else: no other workspace, no agent spool, no platform state. Paths the agent
is told to hide (its config file and directory, the cluster token file, its spool) are
covered with an empty tmpfs (a directory) or an unreadable node (a file) where they fall
under a directory that is bound.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from agents.identity import Identity

SCRIPT_PATH = "/run/spur/job/script"
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
# All of /sys, recursively, rather than the parts GPU runtimes read (/sys/devices,
# /sys/bus, /sys/class, /sys/dev, /sys/module): measured (bench/sandbox_cpu.py), the five
# binds cost a sandbox more CPU than the one (0.1 to 0.35 ms more, where no /sys at all
# saved 0.3 ms, with 11 cgroup mounts under it), since bubblewrap reads the mount table
# again for each bind.
# What the whole shows beyond them is read-only: debugfs, tracefs and bpf are root's
# alone where mounted; the host's cgroup tree (names and counters, no contents of jobs)
# is readable.
READ_ONLY_EXTRAS = ("/sys",)

# The job's first shell, inside the sandbox, as the job's identity. It applies the
# limits, enters the run directory (a job's own one is made by bubblewrap before it,
# `SandboxJob.make_dir`: an exec of `mkdir` would cost a job a millisecond of CPU), opens
# the job's stream files itself, so that the kernel checks them against the job's uid
# and the sandbox's view, tells the agent through fd 3 (its stdout on entry) that the
# script is about to run, and runs the script ($0, `first_shell_command`). What it is
# given (paths, the script's arguments) arrives as arguments, never as shell text: no
# tenant string is ever parsed by a shell.
FIRST_SHELL_PATH = "/bin/sh"
FIRST_SHELL = """\
run=$1 in=$2 out=$3 err=$4
shift 4
{limits}
cd -- "$run" 2>/dev/null || {{ echo "cannot enter the working directory $run" >&2; exit 1; }}
exec 3>&1 <"$in" >>"$out"
if [ -n "$err" ]; then exec 2>>"$err"; else exec 2>&1; fi
printf 1 >&3
exec 3>&-
{run_script}
"""
# The first shell becomes the script (an exec: the kernel runs the interpreter its #!
# line names), or, where that interpreter is the first shell's own (`#!/bin/sh`, no
# argument), runs it itself, as `sh script` would: one exec less, which costs a job 0.7
# ms of CPU in all (bench/sandbox_cpu.py, `exec`). The same $0 and arguments, the same
# process; its variables are unset first. What shows otherwise: its command line (the
# first shell's), and dash names the file in an error's line ("script: 4: script: x: not
# found", not "script: 4: x: not found").
_BECOME = 'exec "$0" "$@"'
_IN_SHELL = 'unset run in out err\n. "$0"'


def first_shell(limit_lines: Iterable[str], *, in_shell: bool = False) -> str:
    return FIRST_SHELL.format(
        limits="\n".join(limit_lines), run_script=_IN_SHELL if in_shell else _BECOME
    )


def in_first_shell(script: str) -> bool:
    """Whether the first shell runs `script` itself: its #! line names the first shell's
    own interpreter and no argument (spaces around it, as the kernel reads it, aside)."""
    line = script[2:].split("\n", 1)[0] if script.startswith("#!") else ""
    return line.strip(" \t") == FIRST_SHELL_PATH


def first_shell_command(
    limit_lines: Iterable[str],
    *,
    run_dir: str,
    stdin: str,
    stdout: str,
    stderr: str,
    argv: Sequence[str] = (),
    in_shell: bool = False,
) -> list[str]:
    """The job's command in its sandbox: its first shell, which runs the script at
    SCRIPT_PATH with `argv` in `run_dir`, its streams opened (`stderr` "": into stdout);
    `in_shell`: run by the first shell itself (`in_first_shell`)."""
    shell = first_shell(limit_lines, in_shell=in_shell)
    return [FIRST_SHELL_PATH, "-c", shell, SCRIPT_PATH, run_dir, stdin, stdout, stderr, *argv]


@dataclass(frozen=True)
class DeviceNode:
    host: str  # where it is on the host
    path: str  # where the job sees it


@dataclass(frozen=True)
class SandboxJob:
    identity: Identity
    workspace: str
    command: Sequence[str]
    env: Mapping[str, str]
    script_fd: int  # copied, read-only, to SCRIPT_PATH
    info_fd: int
    block_fd: int
    devices: Sequence[DeviceNode] = ()
    # More read-only files: (descriptor to copy, path inside), e.g. the srun client.
    files: Sequence[tuple[int, str]] = ()
    # `env` as bubblewrap arguments (`environment_fd`), read from a descriptor rather
    # than the command line: a process's command line is anyone's to read on the host,
    # and the environment holds credentials (the step token, the terminal's API token).
    env_fd: int = -1
    # Symlinks: (target, path inside), e.g. each Slurm command to its dispatcher.
    links: Sequence[tuple[str, str]] = ()
    # Host directories bound read-only: (host path, path inside), e.g. the Slurm
    # commands made once for every sandbox (agents/slurm_cli.py `install_for_sandbox`).
    dirs: Sequence[tuple[str, str]] = ()
    # A directory made (with what is missing above it) as the job's identity before its
    # command starts, in its view: its own run directory. Made there, never on the host,
    # a link that an earlier job left in the workspace leads only where the job may go.
    make_dir: str = ""


class Sandbox(Protocol):
    kind: str

    def wrap(self, job: SandboxJob) -> list[str]:
        """The command line that runs `job.command` in the sandbox (see the docstring)."""
        ...


def device_groups(devices: Iterable[DeviceNode], identity: Identity) -> tuple[int, ...]:
    """Groups the job needs to open its device nodes (AMD's render nodes and /dev/kfd are
    0660 root:render): safe to give, since only this job's nodes exist in its /dev."""
    have = {identity.gid, *identity.groups}
    extra: list[int] = []
    for device in devices:
        try:
            info = os.stat(device.host)
        except OSError:
            continue
        if info.st_mode & 0o006 != 0o006 and info.st_gid not in have and info.st_gid != 0:
            have.add(info.st_gid)
            extra.append(info.st_gid)
    return tuple(extra)


@dataclass
class Bubblewrap:
    executable: str = field(default_factory=lambda: shutil.which("bwrap") or "bwrap")
    hidden: Sequence[str] = ()
    binds: Sequence[str] = ()  # host paths bound read-write at the same place
    kind: str = "bubblewrap"
    _system: list[str] = field(default_factory=list, repr=False)
    _hidden_system: list[str] = field(default_factory=list, repr=False)
    _binds: list[str] = field(default_factory=list, repr=False)  # those not under /sys
    _last: list[str] = field(default_factory=list, repr=False)
    _hidden_workspace: dict[str, list[str]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._system = self._system_view()
        # Made once (a workspace's on its first job): resolving every hidden path for
        # every launch cost a launch more than the rest of its command line.
        self._hidden_system = _hide(
            self.hidden, [*SYSTEM_DIRS, *self.binds], outside=READ_ONLY_EXTRAS
        )
        # /sys last, then what lies over it: bubblewrap reads the whole mount table again
        # for each bind (to set its flags), and /sys brings a dozen mounts with it (the
        # cgroup tree); bound first, each later bind read them too (0.2 ms a sandbox,
        # bench/sandbox_cpu.py `sys-first`).
        self._binds = [path for path in self.binds if not _under(path, READ_ONLY_EXTRAS)]
        self._last = []
        for path in READ_ONLY_EXTRAS:
            if os.path.isdir(path):
                self._last += ["--ro-bind", path, path]
        for path in self.binds:
            if path not in self._binds and os.path.isdir(path):
                self._last += ["--bind", path, path]
        self._last += _hide(self.hidden, READ_ONLY_EXTRAS)

    def wrap(self, job: SandboxJob) -> list[str]:
        argv = [
            self.executable,
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-cgroup-try",
            "--new-session",  # no terminal to steal input from (TIOCSTI)
            # Its supervisor's death (agents/supervisor.py: a fenced job's monitor is
            # killed) takes the whole sandbox down.
            "--die-with-parent",
            "--info-fd", str(job.info_fd),
            "--block-fd", str(job.block_fd),
            *self._system,
            "--proc", "/proc",
            "--dev", "/dev",
            "--tmpfs", "/tmp",
        ]  # fmt: skip
        for device in job.devices:
            if os.path.exists(device.host):
                argv += ["--dev-bind", device.host, device.path]
        # After /tmp, which would cover what lies under it (a test's, a laptop's).
        for path in self._binds:
            if os.path.isdir(path):
                argv += ["--bind", path, path]
        # Hidden paths under the system view first: a tmpfs over a directory that holds
        # the workspace must not cover the workspace mounted after it.
        argv += self._hidden_system
        argv += ["--bind", job.workspace, job.workspace]
        hidden = self._hidden_workspace.get(job.workspace)
        if hidden is None:
            hidden = self._hidden_workspace[job.workspace] = _hide(self.hidden, [job.workspace])
        argv += hidden
        if job.make_dir:
            argv += ["--dir", job.make_dir]
        argv += ["--perms", "0555", "--ro-bind-data", str(job.script_fd), SCRIPT_PATH]
        for fd, path in job.files:
            argv += ["--perms", "0555", "--ro-bind-data", str(fd), path]
        for target, path in job.links:
            argv += ["--symlink", target, path]
        for host, path in job.dirs:
            argv += ["--ro-bind", host, path]
        argv += self._last
        argv += ["--chdir", job.workspace]
        if job.env_fd >= 0:
            argv += ["--args", str(job.env_fd)]
        else:
            argv += _setenv(job.env)
        return [*argv, "--", *job.command]

    def _system_view(self) -> list[str]:
        argv: list[str] = []
        for path in SYSTEM_DIRS:
            if os.path.islink(path):
                argv += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                argv += ["--ro-bind", path, path]
        # /etc/resolv.conf is often a link into /run, which is not bound: keep DNS working.
        resolv = os.path.realpath("/etc/resolv.conf")
        if os.path.isfile(resolv) and not _under(resolv, SYSTEM_DIRS):
            argv += ["--ro-bind", resolv, resolv]
        return argv


def _setenv(env: Mapping[str, str]) -> list[str]:
    argv: list[str] = []
    for key, value in env.items():
        if key and "=" not in key and "\0" not in key + value:
            argv += ["--setenv", key, value]
    return argv


def data_fd(content: bytes, name: str, *, sealed: bool = False) -> int:
    """A descriptor holding `content` from its start (for bubblewrap's --ro-bind-data).
    `sealed`: nobody can change it any more (for one kept and `reopen`ed)."""
    flags = os.MFD_CLOEXEC | (os.MFD_ALLOW_SEALING if sealed else 0)
    fd = os.memfd_create(name, flags)
    view = memoryview(content)
    while view:
        view = view[os.write(fd, view) :]
    if sealed:
        seals = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def reopen(fd: int) -> int:
    """A descriptor of its own (its own offset, from the start) on what `fd` holds: a
    sandbox reads each of its files to the end, and several start at once."""
    return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)


def environment_fd(env: Mapping[str, str]) -> int:
    """A descriptor holding `env` as bubblewrap's `--args` reads it (NUL-separated
    `--setenv KEY VALUE`), from its start; the caller passes it on and closes it."""
    fd = os.memfd_create("spur-env", os.MFD_CLOEXEC)
    args = _setenv(env)
    # One encode of the whole: a job's environment is a hundred and more arguments.
    data = ("\0".join(args) + "\0").encode() if args else b""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _hide(paths: Iterable[str], bound: Sequence[str], outside: Sequence[str] = ()) -> list[str]:
    """What covers each of `paths` that lies under `bound` and not under `outside`."""
    argv: list[str] = []
    for given in paths:
        for path in dict.fromkeys((os.path.abspath(given), os.path.realpath(given))):
            if not _under(path, bound) or _under(path, outside):
                continue
            try:
                info = os.stat(path)
            except OSError:
                continue
            if stat.S_ISDIR(info.st_mode):
                argv += ["--tmpfs", path]
            else:
                # A device node on a nodev mount: exists, cannot be opened.
                argv += ["--ro-bind", "/dev/null", path]
    return argv


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)
