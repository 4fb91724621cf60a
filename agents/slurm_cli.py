"""The Slurm commands inside a job's sandbox: `srun` (the step client, which talks to the
controller and the agents with the job's step credential), and `sbatch`, `squeue`,
`scancel` and the rest of scheduler/cli, which talk to the web API with `SPUR_API_URL`
and `SPUR_TOKEN`.

No platform package is installed in a sandbox (its /usr is the host's), so the agent
builds, once, a zip application of exactly what those commands import: the packages
`scheduler.cli`, `scheduler.slurm`, `scheduler.core` and `scheduler.rpc.errors`, and
python-hostlist. Each sandbox gets it read-only at CLI_PATH, beside it a two-line
dispatcher that runs the command it was called as with the sandbox's `python3`, and in
the tools directory (first on the job's PATH) a symlink to the dispatcher per command
(a link costs the sandbox nothing; a file a mount and a descriptor):

    /run/spur/lib/slurm-cli.pyz      the commands (source only: nothing is written)
    /run/spur/lib/slurm-cli          exec python3 /run/spur/lib/slurm-cli.pyz "${0##*/}" "$@"
    /run/spur/bin/srun, squeue ...   -> /run/spur/lib/slurm-cli

Nothing else of the platform travels: not `spur` (the operator's command, which reads
the controllers' config and cluster token), no agent or controller module, no config.
Which token the commands use is the environment's: the web terminal's shell is given a
short-lived one of its own (agents/terminal.py); a batch job has whatever its submitter
exported.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import stat
import subprocess
import tempfile
import zipfile
from pathlib import Path

CLI_PATH = "/run/spur/lib/slurm-cli.pyz"
DISPATCH_PATH = "/run/spur/lib/slurm-cli"
# The command is the name it was called by: one of the tools directory's links.
DISPATCHER = f'#!/bin/sh\nexec python3 {CLI_PATH} "${{0##*/}}" "$@"\n'.encode()
COMMANDS = (
    "srun",
    "sbatch",
    "squeue",
    "scancel",
    "sacct",
    "sinfo",
    "scontrol",
    "sprio",
    "sshare",
    "sacctmgr",
    "salloc",
)
# What the commands import of the platform (tests/agents/test_slurm_cli.py runs each
# from the bundle with the host's bare python3, so a new import that is missing here
# fails there).
PACKAGES = ("scheduler/cli", "scheduler/slurm", "scheduler/core")
MODULES = (
    "scheduler/__init__.py",
    "scheduler/rpc/__init__.py",
    "scheduler/rpc/errors.py",
    "scheduler/rpc/http.py",
)
LEFT_OUT = ("scheduler/cli/spur.py",)

MAIN = f'''\
"""Runs one of the Slurm commands: `python3 slurm-cli.pyz COMMAND ARGS...`."""
import sys
from importlib import import_module

COMMANDS = {COMMANDS!r}
name = sys.argv[1] if len(sys.argv) > 1 else ""
if name not in COMMANDS:
    sys.exit("usage: slurm-cli.pyz {{" + ",".join(COMMANDS) + "}} [ARGS...]")
sys.argv = [name, *sys.argv[2:]]
sys.exit(import_module("scheduler.cli." + name).script())
'''


def bundle() -> bytes:
    """The zip application (deterministic: the same sources give the same bytes)."""
    import hostlist

    import scheduler

    root = Path(scheduler.__file__).resolve().parent.parent
    names: list[str] = list(MODULES)
    for package in PACKAGES:
        names += sorted(
            str(p.relative_to(root)) for p in (root / package).rglob("*.py") if p.is_file()
        )
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in names:
            if name not in LEFT_OUT:
                _add(archive, name, (root / name).read_bytes())
        _add(archive, "hostlist.py", Path(hostlist.__file__).read_bytes())
        _add(archive, "__main__.py", MAIN.encode())
    return buffer.getvalue()


def _add(archive: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o444 << 16
    archive.writestr(info, data)


def sandbox_files() -> list[tuple[bytes, str]]:
    """(content, path inside the sandbox) of the bundle and its dispatcher."""
    return [(bundle(), CLI_PATH), (DISPATCHER, DISPATCH_PATH)]


def sandbox_links(tools_dir: str) -> list[tuple[str, str]]:
    """(target, path inside the sandbox) of each command's link to the dispatcher."""
    return [(DISPATCH_PATH, f"{tools_dir}/{command}") for command in COMMANDS]


# A sandbox gets the bundle's directory and the links' directory bound read-only from
# here (`install_for_sandbox`), at these paths.
LIB_DIR = os.path.dirname(CLI_PATH)
TOOLS_PREFIX = ".spur-tools-"  # no organisation's name starts with a dot


def install_for_sandbox(root: Path, tools_dir: str) -> list[tuple[str, str]]:
    """The bundle, its dispatcher and the commands' links as directories under `root`
    (the work root: every job's identity can pass through it), made once for all the
    sandboxes of this agent and of the next one with the same bundle; (host directory,
    path inside the sandbox) of each, to bind read-only.

    Why: copied into each sandbox (`sandbox_files`), the 250 KB bundle cost every job
    and every step task about 0.4 ms of CPU, and its eleven links some more; two
    read-only binds of directories cost a sandbox no more than two copied files.

    The directory is this process's (root's, in production), readable by all and
    writable by nobody else, and named by a digest of what it holds; it is made whole
    under another name, then renamed, and one found already there is used only if it
    is ours, not a link, and holds exactly these bytes. Raises OSError if it cannot be
    made (the caller then copies the files into each sandbox, as before)."""
    if os.statvfs(root).f_flag & os.ST_NOEXEC:
        # The dispatcher is executed: a bind keeps its mount's noexec.
        raise OSError(f"{root} is mounted noexec")
    files = {os.path.basename(path): content for content, path in sandbox_files()}
    links = {os.path.basename(path): target for target, path in sandbox_links(tools_dir)}
    digest = hashlib.sha256(repr((sorted(files.items()), sorted(links.items()))).encode())
    final = root / f"{TOOLS_PREFIX}{digest.hexdigest()[:20]}"
    made = [(str(final / "lib"), LIB_DIR), (str(final / "bin"), tools_dir)]
    if _holds(final, files, links):
        return made
    fresh = Path(tempfile.mkdtemp(prefix=f"{final.name}.", dir=root))
    try:
        for name in ("lib", "bin"):
            (fresh / name).mkdir()
        for name, content in files.items():
            (fresh / "lib" / name).write_bytes(content)
            os.chmod(fresh / "lib" / name, 0o555)  # as a copy's (`--perms 0555`)
        for name, target in links.items():
            os.symlink(target, fresh / "bin" / name)
        for directory in (fresh, fresh / "lib", fresh / "bin"):
            os.chmod(directory, 0o755)
        try:
            fresh.rename(final)
        except OSError:  # another agent made it meanwhile, or a bad one is in the way
            if not _holds(final, files, links):
                if final.is_symlink() or not final.is_dir():
                    raise
                shutil.rmtree(final)
                fresh.rename(final)
    finally:
        shutil.rmtree(fresh, ignore_errors=True)
    if not _holds(final, files, links):
        raise OSError(f"cannot make {final}")
    return made


def _holds(directory: Path, files: dict[str, bytes], links: dict[str, str]) -> bool:
    """Whether `directory` is ours (not a link), writable by us alone, and holds these
    files and links and nothing else."""
    try:
        for path in (directory, directory / "lib", directory / "bin"):
            info = os.lstat(path)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
                return False
            if info.st_mode & 0o022:
                return False
        if sorted(os.listdir(directory)) != ["bin", "lib"]:
            return False
        if sorted(os.listdir(directory / "lib")) != sorted(files):
            return False
        for name, content in files.items():
            info = os.lstat(directory / "lib" / name)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
                return False
            if info.st_mode & 0o222 or (directory / "lib" / name).read_bytes() != content:
                return False
        if sorted(os.listdir(directory / "bin")) != sorted(links):
            return False
        return all(os.readlink(directory / "bin" / n) == t for n, t in links.items())
    except OSError:
        return False


SYSTEM_PATH = "/usr/bin:/bin"  # where every account finds the host's python3


def install_for_host(directory: Path) -> Path:
    """The Slurm commands as files under `directory`, for host accounts that cannot run
    the platform's virtual environment (its interpreter may live in a private home):
    `make up`'s job user, so that `runuser -u "$SPUR_JOB_USER" -- sbatch` works as on a
    cluster. The bundle's sources go in `lib/`, compiled by the host's own python3 (each
    run then loads bytecode instead of compiling the CLI again), and a script per
    command in `bin/`, which is returned. Readable by all,
    writable by the caller only; replaced whole, so a running command never sees half of
    a new one."""
    python = shutil.which("python3", path=SYSTEM_PATH)
    if python is None:
        raise RuntimeError(f"no python3 in {SYSTEM_PATH} for the Slurm commands of the host")
    directory = directory.resolve()
    fresh = directory.with_name(directory.name + ".new")
    shutil.rmtree(fresh, ignore_errors=True)
    lib, bin_dir = fresh / "lib", fresh / "bin"
    with zipfile.ZipFile(io.BytesIO(bundle())) as archive:
        archive.extractall(lib)
    (lib / "__main__.py").unlink()
    subprocess.run([python, "-m", "compileall", "-q", str(lib)], check=True, env={})
    bin_dir.mkdir()
    final_lib = directory / "lib"
    for command in COMMANDS:
        script = bin_dir / command
        script.write_text(
            f"#!{python}\nimport sys\nsys.path.insert(0, {str(final_lib)!r})\n"
            f"from scheduler.cli.{command} import script\nsys.exit(script())\n"
        )
    for root, _dirs, files in os.walk(fresh):
        os.chmod(root, 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o755 if root == str(bin_dir) else 0o644)
    old = directory.with_name(directory.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if directory.exists():
        directory.rename(old)
    fresh.rename(directory)
    shutil.rmtree(old, ignore_errors=True)
    return directory / "bin"


__all__ = [
    "CLI_PATH",
    "COMMANDS",
    "DISPATCH_PATH",
    "bundle",
    "install_for_host",
    "install_for_sandbox",
    "sandbox_files",
    "sandbox_links",
]
