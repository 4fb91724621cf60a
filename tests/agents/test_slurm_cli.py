"""The Slurm commands' bundle for job sandboxes (agents/slurm_cli.py): run with the host's
bare python3 (no platform package, no site-packages, an empty environment), as a sandbox
runs it, each command works from it alone; nothing but the commands travels."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import zipfile
from io import BytesIO
from pathlib import Path

import pytest

from agents import slurm_cli

PYTHON = next(
    (p for p in ("/usr/bin/python3", shutil.which("python3")) if p and Path(p).exists()), None
)


@pytest.fixture(scope="module")
def pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "slurm-cli.pyz"
    path.write_bytes(slurm_cli.bundle())
    return path


def run(pyz: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert PYTHON is not None
    # -I: neither the environment nor the user's or this checkout's packages.
    return subprocess.run(
        [PYTHON, "-I", str(pyz), *args], capture_output=True, text=True, env={}, cwd="/", timeout=60
    )


@pytest.mark.parametrize("command", slurm_cli.COMMANDS)
def test_each_command_runs_from_the_bundle_alone(pyz: Path, command: str) -> None:
    done = run(pyz, command, "--help")
    assert done.returncode == 0, done.stderr
    assert command in done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    # Every module a command imports on its way to the server is in the bundle.
    assert PYTHON is not None
    imported = subprocess.run(
        [PYTHON, "-I", "-c", f"import sys; sys.path.insert(0, {str(pyz)!r}); "
         f"import scheduler.cli.{command}, scheduler.cli.api, scheduler.cli.config"],
        capture_output=True, text=True, env={}, cwd="/", timeout=60,
    )  # fmt: skip
    assert imported.returncode == 0, imported.stderr


def test_without_a_token_a_command_says_what_to_set(pyz: Path) -> None:
    done = run(pyz, "squeue")
    assert done.returncode == 1
    assert "squeue: error: no Spur API configured: set SPUR_API_URL" in done.stderr


def test_an_unknown_command_is_refused(pyz: Path) -> None:
    for args in ((), ("spur",), ("rm",)):
        done = run(pyz, *args)
        assert done.returncode == 1
        assert done.stderr.startswith("usage: slurm-cli.pyz {srun,sbatch,squeue,")


def test_the_bundle_holds_the_commands_and_nothing_of_the_agent_or_the_controller() -> None:
    data = slurm_cli.bundle()
    assert data == slurm_cli.bundle()  # the same sources, the same bytes
    names = zipfile.ZipFile(BytesIO(data)).namelist()
    assert "__main__.py" in names and "hostlist.py" in names
    tops = {n.split("/")[0] for n in names}
    assert tops == {"__main__.py", "hostlist.py", "scheduler"}
    assert {n.split("/")[1] for n in names if n.startswith("scheduler/")} == {
        "__init__.py", "cli", "core", "rpc", "slurm",
    }  # fmt: skip
    assert [n for n in names if n.startswith("scheduler/rpc/")] == [
        "scheduler/rpc/__init__.py",
        "scheduler/rpc/errors.py",
        "scheduler/rpc/http.py",
    ]
    assert "scheduler/cli/spur.py" not in names  # the operator's: controllers and cluster token


def test_each_command_is_a_link_to_a_dispatcher_that_runs_it_with_the_sandboxs_python(
    tmp_path: Path,
) -> None:
    files = dict((path, content) for content, path in slurm_cli.sandbox_files())
    assert set(files) == {slurm_cli.CLI_PATH, slurm_cli.DISPATCH_PATH}
    links = dict((path, target) for target, path in slurm_cli.sandbox_links("/run/spur/bin"))
    assert links == {f"/run/spur/bin/{c}": slurm_cli.DISPATCH_PATH for c in slurm_cli.COMMANDS}
    # Called by its link's name, the dispatcher runs that command of the bundle.
    dispatcher = tmp_path / "slurm-cli"
    dispatcher.write_bytes(files[slurm_cli.DISPATCH_PATH].replace(b"python3", b"echo python3"))
    dispatcher.chmod(0o755)
    (tmp_path / "sbatch").symlink_to(dispatcher)
    done = subprocess.run([str(tmp_path / "sbatch"), "--wrap", "a b"], capture_output=True)
    assert done.stdout == b"python3 /run/spur/lib/slurm-cli.pyz sbatch --wrap a b\n"


def test_the_hosts_commands_run_for_any_account_from_compiled_sources() -> None:
    """`make up` installs the commands for the host (demo.env puts them first on PATH):
    an account that cannot run the platform's venv runs them with the host's python3,
    from bytecode compiled at install; installing again replaces them whole."""
    import os
    import tempfile

    reachable = Path(tempfile.mkdtemp(prefix="spur-tools-", dir="/tmp"))
    try:
        reachable.chmod(0o711)
        bin_dir = slurm_cli.install_for_host(reachable / ".tools")
        assert sorted(p.name for p in bin_dir.iterdir()) == sorted(slurm_cli.COMMANDS)
        lib = reachable / ".tools" / "lib"
        assert list(lib.glob("scheduler/cli/__pycache__/sbatch.*.pyc"))
        assert not (lib / "scheduler" / "cli" / "spur.py").exists()  # the operator's only
        runner = ["runuser", "-u", "nobody", "--"] if os.geteuid() == 0 else []
        done = subprocess.run(
            [*runner, "env", "-i", "PATH=/usr/bin:/bin", str(bin_dir / "sbatch"), "--version"],
            capture_output=True, text=True, cwd="/", timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("slurm ")
        done = subprocess.run(
            [*runner, "env", "-i", "PATH=/usr/bin:/bin", str(bin_dir / "squeue")],
            capture_output=True, text=True, cwd="/", timeout=60,
        )  # fmt: skip
        assert "no Spur API configured" in done.stderr
        (lib / "stale").write_text("")
        assert slurm_cli.install_for_host(reachable / ".tools") == bin_dir
        assert not (lib / "stale").exists()
        assert not (reachable / ".tools.new").exists() and not (reachable / ".tools.old").exists()
    finally:
        shutil.rmtree(reachable, ignore_errors=True)


def test_the_sandboxs_commands_are_made_once_under_the_work_root_read_only(
    tmp_path: Path,
) -> None:
    """Bound read-only into every sandbox (agents/slurm_cli.py `install_for_sandbox`):
    the same bytes as the copies they replace, nobody's to write but their maker's."""
    made = slurm_cli.install_for_sandbox(tmp_path, "/run/spur/bin")
    (lib, lib_inside), (bin_dir, bin_inside) = made
    assert (lib_inside, bin_inside) == ("/run/spur/lib", "/run/spur/bin")
    files = {os.path.basename(path): content for content, path in slurm_cli.sandbox_files()}
    assert {p.name: p.read_bytes() for p in Path(lib).iterdir()} == files
    links = {p.name: os.readlink(p) for p in Path(bin_dir).iterdir()}
    assert links == {command: slurm_cli.DISPATCH_PATH for command in slurm_cli.COMMANDS}
    for path in (Path(lib).parent, Path(lib), Path(bin_dir), *Path(lib).iterdir()):
        info = path.lstat()
        assert info.st_uid == os.geteuid() and not info.st_mode & 0o022, path
        assert info.st_mode & 0o005 == 0o005  # every job's identity reads it
    assert all(not p.stat().st_mode & stat.S_IWUSR for p in Path(lib).iterdir())
    # The next agent's, with the same bundle: the same directory, not made again.
    inode = Path(lib).parent.stat().st_ino
    assert slurm_cli.install_for_sandbox(tmp_path, "/run/spur/bin") == made
    assert Path(lib).parent.stat().st_ino == inode
    assert [p.name for p in tmp_path.iterdir()] == [Path(lib).parent.name]


def test_a_sandboxs_commands_directory_that_holds_anything_else_is_made_again(
    tmp_path: Path,
) -> None:
    (lib, _), _ = slurm_cli.install_for_sandbox(tmp_path, "/run/spur/bin")
    pyz = Path(lib) / "slurm-cli.pyz"
    os.chmod(pyz, 0o755)
    pyz.write_bytes(b"import os; os.system('evil')")
    assert slurm_cli.install_for_sandbox(tmp_path, "/run/spur/bin")[0][0] == lib
    assert pyz.read_bytes() == slurm_cli.bundle()
    (Path(lib) / "extra").write_text("")
    slurm_cli.install_for_sandbox(tmp_path, "/run/spur/bin")
    assert not (Path(lib) / "extra").exists()
    # A link in its place is never followed nor replaced: the caller copies the files.
    top = Path(lib).parent
    shutil.rmtree(top)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    top.symlink_to(elsewhere)
    with pytest.raises(OSError):
        slurm_cli.install_for_sandbox(tmp_path, "/run/spur/bin")
    assert list(elsewhere.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([top.name, "elsewhere"])


def test_on_a_noexec_work_root_the_commands_are_not_made_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A bind keeps its mount's noexec, and the dispatcher is executed: the launcher then
    # copies the files into each sandbox (agents/launcher.py `tool_dirs`).
    class NoExec:
        f_flag = os.ST_NOEXEC

    monkeypatch.setattr(slurm_cli.os, "statvfs", lambda path: NoExec())
    with pytest.raises(OSError, match="noexec"):
        slurm_cli.install_for_sandbox(tmp_path, "/run/spur/bin")
    assert list(tmp_path.iterdir()) == []
