"""What a tenant's job tries, and cannot do: each test is an attack that the agent before
sandboxing let through (jobs ran as root, in the host's file system, anywhere)."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agents import slurm_cli
from agents.credentials import NodeCredential
from agents.identity import Identities, Identity
from agents.launcher import Launcher, LaunchRequest
from agents.sandbox import SCRIPT_PATH, Bubblewrap, SandboxJob, environment_fd, in_first_shell
from scheduler.rpc import signatures
from tests.agents.conftest import AS_ROOT, OTHER_TENANT, RecordingReporter, root_only

Payload = Callable[..., dict[str, Any]]


def run(launcher: Launcher, payload: Payload, job_id: int, script: str, **kw: Any) -> None:
    launcher.launch(LaunchRequest.from_payload(payload(job_id, script, **kw)))
    assert launcher.wait(job_id, 1, timeout=20)


@pytest.fixture
def secrets(reachable_tmp: Path) -> dict[str, Path]:
    """Platform files as `spurcloud up` leaves them, made world-readable on purpose: only
    the sandbox, not their mode, keeps a job from them here."""
    state = Path(tempfile.mkdtemp(dir=reachable_tmp))
    state.chmod(0o755)
    files = {
        "token": state / "cluster-token",
        "secret_key": state / "secret-key",
        "database": state / "spurcloud.sqlite3",
    }
    for name, path in files.items():
        path.write_text(f"the-{name}-content\n")
        path.chmod(0o644)
    return files


def test_a_job_runs_as_neither_root_nor_the_agent(
    launcher: Launcher, payload: Payload, workspace: Path, identity: Identity
) -> None:
    run(launcher, payload, 1, "#!/bin/bash\nid -u\nid -g\n", workdir=".")
    uid, gid = (int(v) for v in (workspace / "slurm-1.out").read_text().split())
    assert uid != 0 and gid != 0
    assert (uid, gid) == (identity.uid, identity.gid)
    if AS_ROOT:
        assert uid != os.geteuid()


def test_a_job_holds_no_capability_and_can_gain_no_privilege(
    launcher: Launcher, payload: Payload, workspace: Path
) -> None:
    run(
        launcher,
        payload,
        21,
        "#!/bin/bash\ngrep -E '^(Cap|NoNewPrivs)' /proc/self/status\n",
        workdir=".",
    )
    lines = (workspace / "slurm-21.out").read_text().splitlines()
    status = dict(line.split(":\t") for line in lines)
    assert status["NoNewPrivs"] == "1"
    for capabilities in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
        assert int(status[capabilities], 16) == 0, capabilities
    if AS_ROOT:  # a personal agent's bounding set is its own; an account's is empty
        assert int(status["CapBnd"], 16) == 0


@root_only
def test_each_organisation_has_its_own_identity(launcher: Launcher, identities: Identities) -> None:
    acme = identities.for_job(tenant="acme", user="alice")
    globex = identities.for_job(tenant=OTHER_TENANT, user="alice")
    assert acme.name == "spur-acme" and globex.name == "spur-globex"
    assert acme.uid != globex.uid
    low, high = identities.uid_range
    assert low <= acme.uid <= high and low <= globex.uid <= high


def test_a_job_cannot_read_the_platforms_secrets(
    launcher: Launcher, payload: Payload, workspace: Path, secrets: dict[str, Path]
) -> None:
    reads = "".join(f"cat {path}\n" for path in secrets.values())
    run(launcher, payload, 2, f"#!/bin/bash\n{reads}", workdir=".")
    out = (workspace / "slurm-2.out").read_text()
    assert "content" not in out
    assert out.count("No such file or directory") == len(secrets)


def test_a_job_cannot_read_the_agents_spool(
    tmp_path: Path, launcher: Launcher, payload: Payload, workspace: Path
) -> None:
    run(launcher, payload, 3, "#!/bin/bash\necho another tenant's script\n")
    spool = tmp_path / "spool"
    script = f"#!/bin/bash\ncat {spool}/jobs/3.1/script\nls {spool}\nls /run/spur/job\n"
    run(launcher, payload, 4, script, workdir=".")
    out = (workspace / "slurm-4.out").read_text()
    assert "another tenant" not in out
    assert out.count("No such file or directory") == 2
    assert out.splitlines()[-1] == "script"  # its own script is all it sees


def test_a_job_cannot_read_another_organisations_workspace(
    launcher: Launcher, payload: Payload, workspace: Path, work_root: Path
) -> None:
    run(launcher, payload, 5, "#!/bin/bash\necho globex-private\n", tenant=OTHER_TENANT)
    theirs = work_root / OTHER_TENANT / "jobs" / "5" / "slurm-5.out"
    assert theirs.read_text() == "globex-private\n"
    script = f"#!/bin/bash\ncat {theirs}\nls {work_root}\n"
    run(launcher, payload, 6, script, workdir=".")
    out = (workspace / "slurm-6.out").read_text()
    assert "globex-private" not in out
    assert out.splitlines()[-1] == "acme"  # the work root holds its own workspace only
    if AS_ROOT:
        assert stat.S_IMODE((work_root / OTHER_TENANT).stat().st_mode) == 0o700


def test_a_job_sees_the_system_directories_and_nothing_else_of_the_host(
    launcher: Launcher, payload: Payload, workspace: Path
) -> None:
    marker = Path(tempfile.mkstemp(prefix="spur-host-tmp-", dir="/tmp")[1])
    try:
        script = (
            "#!/bin/bash\nls /\ntouch /usr/x /etc/x 2>&1 | wc -l\n"
            f"[ -e {marker} ] && echo 1 || echo 0\n"
        )
        run(launcher, payload, 7, script, workdir=".")
    finally:
        marker.unlink()
    out = (workspace / "slurm-7.out").read_text().split()
    listed, refused, host_tmp = set(out[:-2]), out[-2], out[-1]
    assert {"usr", "etc", "proc", "dev", "tmp"} <= listed
    assert not listed & {"root", "home", "var", "srv", "mnt", "media", "work"}
    assert (refused, host_tmp) == ("2", "0")  # read-only; the host's /tmp is not there


def test_an_output_file_in_etc_is_refused_and_nothing_is_created(
    launcher: Launcher, reporter: RecordingReporter, payload: Payload
) -> None:
    target = Path(f"/etc/spur-attack-{os.getpid()}")
    run(launcher, payload, 8, "#!/bin/bash\necho pwned\n", stdout=str(target))
    finished = reporter.finished(8)
    assert finished["exit_code"] == 1
    assert "outside the workspace" in finished["reason"]
    assert not target.exists()


def test_a_job_name_cannot_add_path_components(
    launcher: Launcher, payload: Payload, workspace: Path, work_root: Path
) -> None:
    run(launcher, payload, 9, "#!/bin/bash\necho named\n", workdir=".", stdout="%x.out",
        name="../escaped")  # fmt: skip
    assert not (work_root / "escaped.out").exists()
    assert (workspace / ".._escaped.out").read_text() == "named\n"
    run(launcher, payload, 10, "#!/bin/bash\necho dots\n", workdir=".", stdout="out/%x",
        name="..")  # fmt: skip
    assert not (workspace / "out").exists()  # "out/__" has no directory "out": refused
    assert not (work_root / "out").exists()


def test_a_symlink_planted_by_an_earlier_job_is_not_followed_out_of_the_workspace(
    launcher: Launcher, reporter: RecordingReporter, payload: Payload, workspace: Path,
    reachable_tmp: Path,
) -> None:  # fmt: skip
    # A directory anyone may write: only the sandbox keeps the job out of it.
    victim_dir = Path(tempfile.mkdtemp(dir=reachable_tmp))
    victim_dir.chmod(0o777)
    victim = victim_dir / "victim"
    plant = f"#!/bin/bash\nln -s {victim} planted.out\nln -s {victim_dir} planted-dir\n"
    run(launcher, payload, 11, plant, workdir=".")
    assert (workspace / "planted.out").is_symlink()
    run(launcher, payload, 12, "#!/bin/bash\necho pwned\n", workdir=".", stdout="planted.out")
    assert "outside the workspace" in reporter.finished(12)["reason"]
    # Through the link at run time (no agent check on the way): it leads nowhere there.
    script = "#!/bin/bash\necho pwned > planted.out\necho pwned > planted-dir/victim\n"
    run(launcher, payload, 13, script, workdir=".")
    assert not victim.exists()
    assert os.listdir(victim_dir) == []


def test_a_workdir_outside_the_workspace_is_refused(
    launcher: Launcher, reporter: RecordingReporter, payload: Payload
) -> None:
    run(launcher, payload, 14, "#!/bin/bash\nls\n", workdir="/root")
    finished = reporter.finished(14)
    assert (finished["exit_code"], finished["signal"]) == (1, 0)
    assert "working directory /root is outside the workspace" in finished["reason"]


def test_a_workdir_that_leaves_the_workspace_through_a_symlink_is_refused(
    launcher: Launcher, reporter: RecordingReporter, payload: Payload, workspace: Path
) -> None:
    os.symlink("/etc", workspace / "etc-link")
    run(launcher, payload, 15, "#!/bin/bash\nls\n", workdir="etc-link")
    assert "outside the workspace" in reporter.finished(15)["reason"]


def test_stdin_from_a_secret_file_is_refused(
    launcher: Launcher, reporter: RecordingReporter, payload: Payload, secrets: dict[str, Path]
) -> None:
    run(launcher, payload, 16, "#!/bin/bash\ncat\n", stdin=str(secrets["token"]))
    finished = reporter.finished(16)
    assert finished["exit_code"] == 1
    assert "input file" in finished["reason"] and "outside the workspace" in finished["reason"]


@root_only
def test_a_job_sees_the_device_nodes_of_its_own_gpus_only(
    tmp_path: Path, payload: Payload, work_root: Path, reachable_tmp: Path,
    make_launcher: Callable[..., Launcher],
) -> None:  # fmt: skip
    devices = Path(tempfile.mkdtemp(dir=reachable_tmp))
    devices.chmod(0o755)
    names = [f"nvidia{i}" for i in range(4)] + ["nvidiactl", "nvidia-uvm"]
    for name in names:
        os.mknod(devices / name, 0o666 | stat.S_IFCHR, os.makedev(1, 3))

    def nodes(*names: str) -> list[dict[str, str]]:
        return [{"path": f"/dev/{n}", "hostPath": str(devices / n)} for n in names]

    spec = {
        "cdiVersion": "0.6.0",
        "kind": "nvidia.com/gpu",
        "devices": [
            {"name": str(i), "containerEdits": {"deviceNodes": nodes(f"nvidia{i}")}}
            for i in range(4)
        ],
        "containerEdits": {"deviceNodes": nodes("nvidiactl", "nvidia-uvm")},
    }
    cdi = tmp_path / "nvidia-gpu.json"
    cdi.write_text(json.dumps(spec))
    launcher = make_launcher(cdi_spec=cdi)
    listing = "#!/bin/bash\nls /dev | grep nvidia || true\necho $CUDA_VISIBLE_DEVICES\n"
    run(launcher, payload, 17, listing, gpus=[1, 3])
    run(launcher, payload, 18, listing)
    workspace = work_root / "acme" / "jobs"
    *seen, visible = (workspace / "17" / "slurm-17.out").read_text().split()
    assert sorted(seen) == ["nvidia-uvm", "nvidia1", "nvidia3", "nvidiactl"]
    # Only its GPUs exist for it: the runtimes number them 0 and 1, as in a container.
    assert visible == "0,1"
    assert (workspace / "18" / "slurm-18.out").read_text() == "\n"


def test_a_memory_hog_ends_out_of_memory(
    launcher: Launcher, reporter: RecordingReporter, payload: Payload
) -> None:
    hog = "#!/bin/bash\npython3 -c 'b = bytearray(1024 * 1024 * 1024)'\n"
    run(launcher, payload, 19, hog, mem_mb=64)
    finished = reporter.finished(19)
    assert finished["oom"] is True
    assert finished["reason"] == "OutOfMemory"
    assert finished["exit_code"] != 0


def test_a_job_that_fails_for_another_reason_is_not_out_of_memory(
    launcher: Launcher, reporter: RecordingReporter, payload: Payload
) -> None:
    run(launcher, payload, 20, "#!/bin/bash\necho 'CUDA out of memory' >&2\nexit 1\n")
    assert (reporter.finished(20)["oom"], reporter.finished(20)["reason"]) == (False, "")


def test_a_fork_bomb_meets_the_jobs_process_cap(
    payload: Payload, work_root: Path, make_launcher: Callable[..., Launcher]
) -> None:
    launcher = make_launcher(pids_max=20)
    forks = (
        "import os, time\n"
        "n = 0\n"
        "for _ in range(40):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(1)\n"
        "        os._exit(0)\n"
        "    n += 1\n"
        "print(n)\n"
    )
    script = f"#!/usr/bin/env python3\n{forks}"
    try:
        run(launcher, payload, 21, script)
    finally:
        launcher.kill_all()
    started = int((work_root / "acme" / "jobs" / "21" / "slurm-21.out").read_text().split()[-1])
    assert started < 20


def test_a_hidden_path_under_a_bound_directory_cannot_be_read(
    payload: Payload, work_root: Path, reachable_tmp: Path,
    make_launcher: Callable[..., Launcher],
) -> None:  # fmt: skip
    shared = Path(tempfile.mkdtemp(dir=reachable_tmp))
    shared.chmod(0o755)
    (shared / "data.txt").write_text("shared data\n")
    (shared / "spur.toml").write_text("token = 'the-token'\n")
    (shared / "state").mkdir()
    (shared / "state" / "cluster-token").write_text("the-token\n")
    for path in (shared / "data.txt", shared / "spur.toml", shared / "state" / "cluster-token"):
        path.chmod(0o644)
    sandbox = Bubblewrap(
        binds=[str(shared)], hidden=[str(shared / "spur.toml"), str(shared / "state")]
    )
    launcher = make_launcher(sandbox=sandbox)
    script = f"#!/bin/bash\ncd {shared}\ncat data.txt spur.toml state/cluster-token\n"
    run(launcher, payload, 22, script)
    out = (work_root / "acme" / "jobs" / "22" / "slurm-22.out").read_text()
    assert "shared data" in out
    assert "the-token" not in out


def test_a_hidden_path_under_sys_stays_hidden_though_sys_is_bound_last(
    payload: Payload, work_root: Path, make_launcher: Callable[..., Launcher]
) -> None:
    """/sys is bound after every other mount (bubblewrap rereads the mount table at each
    bind, and /sys holds a dozen mounts), and what hides a part of it after it."""
    launcher = make_launcher(sandbox=Bubblewrap(hidden=["/sys/kernel"]))
    script = "#!/bin/sh\nls /sys/kernel | wc -l\nls /sys/class | wc -l\nmount | grep -c ' /sys'\n"
    run(launcher, payload, 23, script)
    hidden, shown, mounts = (
        (work_root / "acme" / "jobs" / "23" / "slurm-23.out").read_text().split()
    )
    assert (hidden, int(shown) > 0, int(mounts) > 1) == ("0", True, True)


def test_sys_is_bound_after_every_other_mount() -> None:
    sandbox = Bubblewrap(hidden=["/sys/kernel", "/etc/shadow"])
    job = SandboxJob(
        identity=Identity(name="acme", uid=1000, gid=1000), workspace="/tmp",
        command=["/bin/true"], env={}, script_fd=5, info_fd=6, block_fd=7,
        dirs=[("/usr/lib", "/run/spur/lib")],
    )  # fmt: skip
    argv = sandbox.wrap(job)
    at = argv.index("/sys") - 1
    assert argv[at : at + 3] == ["--ro-bind", "/sys", "/sys"]
    mounts = ("--bind", "--ro-bind", "--dev-bind", "--ro-bind-data", "--tmpfs", "--proc", "--dev")
    after = [argv[i + 1] for i in range(at + 3, len(argv)) if argv[i] in mounts]
    assert after == ["/sys/kernel"]  # only what lies over it
    shadow = argv.index("/etc/shadow")
    assert argv[shadow - 2 : shadow] == ["--ro-bind", "/dev/null"]
    assert shadow < at  # over /etc, before the workspace: not moved


def test_the_environment_reaches_bubblewrap_as_setenv_arguments_in_a_descriptor() -> None:
    env = {"PATH": "/usr/bin", "NOTE": "héllo wörld", "A=B": "x", "NUL": "a\0b", "EMPTY": ""}
    fd = environment_fd(env)
    try:
        data = os.read(fd, 1 << 16)
    finally:
        os.close(fd)
    # What cannot be one variable (a name with "=", a NUL anywhere) is left out.
    args = ["--setenv", "PATH", "/usr/bin", "--setenv", "NOTE", "héllo wörld"]
    args += ["--setenv", "EMPTY", ""]
    assert data == b"".join(arg.encode() + b"\0" for arg in args)
    empty = environment_fd({})
    try:
        assert os.read(empty, 16) == b""
    finally:
        os.close(empty)


def test_a_jobs_link_planted_by_an_earlier_job_makes_no_directory_outside_the_workspace(
    launcher: Launcher, payload: Payload, workspace: Path, reachable_tmp: Path
) -> None:
    # The run directory of a job that names none is made before its sandbox starts, on
    # the host: a `jobs` link left by an earlier job must not take that there.
    victim_dir = Path(tempfile.mkdtemp(dir=reachable_tmp))
    victim_dir.chmod(0o777)
    run(launcher, payload, 30, f"#!/bin/bash\nrm -rf jobs\nln -s {victim_dir} jobs\n",
        workdir=".")  # fmt: skip
    assert (workspace / "jobs").is_symlink()
    run(launcher, payload, 31, "#!/bin/bash\necho ran\n")
    assert os.listdir(victim_dir) == []


def test_a_jobs_own_run_directory_is_made_in_its_sandbox_as_its_identity(
    launcher: Launcher, payload: Payload, workspace: Path, identity: Identity
) -> None:
    # By bubblewrap (--dir), with what is missing above it, before the first shell
    # enters it: no exec of `mkdir`, and nothing made on the host as anyone else.
    run(launcher, payload, 32, "#!/bin/sh\npwd\n")
    made = workspace / "jobs" / "32"
    assert made.is_dir()
    assert (made.stat().st_uid, made.stat().st_gid) == (identity.uid, identity.gid)
    assert (made / "slurm-32.out").read_text() == f"{made}\n"
    # One that exists is kept as it is.
    run(launcher, payload, 33, "#!/bin/sh\nmkdir ../34 && touch ../34/kept\n")
    run(launcher, payload, 34, "#!/bin/sh\nls\n")
    assert (workspace / "jobs" / "34" / "slurm-34.out").read_text() == "kept\nslurm-34.out\n"


def test_a_sh_script_runs_in_the_first_shell_as_in_a_shell_of_its_own(
    launcher: Launcher, reporter: RecordingReporter, payload: Payload, workspace: Path
) -> None:
    # `#!/bin/sh` (the first shell's own): run by the first shell itself, an exec less;
    # any other interpreter: the first shell becomes the script. Either way the script
    # sees its own $0 and arguments, none of the first shell's variables, and its status
    # is the job's.
    script = (
        '#!{}\necho "$0|$#|$1|$2|${{run-}}${{in-}}${{out-}}${{err-}}"\n'
        "tr '\\0' ' ' </proc/$$/cmdline | head -c 12; echo\nexit 7\n"
    )
    for job_id, interpreter, shown in (
        (35, "/bin/sh", "/bin/sh -c r"),
        (36, "/bin/bash", "/bin/bash /r"),
    ):
        run(launcher, payload, job_id, script.format(interpreter), argv=["a", "b c"])
        out = (workspace / "jobs" / str(job_id) / f"slurm-{job_id}.out").read_text()
        assert out == f"{SCRIPT_PATH}|2|a|b c|\n{shown}\n"
        assert reporter.finished(job_id)["exit_code"] == 7


def test_only_a_script_for_the_first_shells_own_interpreter_runs_in_it() -> None:
    for script in ("#!/bin/sh\ntrue\n", "#! /bin/sh \ntrue\n", "#!/bin/sh"):
        assert in_first_shell(script), script
    for script in ("#!/bin/sh -e\n", "#!/bin/bash\n", "#!/bin/sh\r\n", "#!/bin/shx\n", "echo\n"):
        assert not in_first_shell(script), script


def test_the_slurm_commands_run_from_a_read_only_directory_no_job_can_change(
    launcher: Launcher, payload: Payload, workspace: Path, tmp_path: Path
) -> None:
    credential = NodeCredential(tmp_path / "credential", "sim01")
    credential.store(signatures.node_key(os.urandom(32), "sim01").hex())
    launcher.credential = credential  # a registered node's: its sandboxes get the tools
    [(lib, _), (bin_dir, _)] = launcher.tool_dirs()
    assert (launcher.tool_files(), launcher.tool_links()) == ([], [])  # nothing copied
    before = {p.name: p.read_bytes() for p in Path(lib).iterdir()}
    script = (
        "#!/bin/bash\nsinfo --version\nls /run/spur/bin | wc -l\n"
        "for p in /run/spur/lib/x /run/spur/bin/x /run/spur/lib/slurm-cli.pyz; do\n"
        "  echo x 2>/dev/null >> $p && echo wrote $p\ndone\n"
        "rm -f /run/spur/bin/srun 2>/dev/null && echo removed\n"
        "chmod 777 /run/spur/lib/slurm-cli 2>/dev/null && echo chmodded\n"
    )
    run(launcher, payload, 32, script, workdir=".")
    out = (workspace / "slurm-32.out").read_text().split("\n")
    assert out[0].startswith("slurm ") and int(out[1]) == len(slurm_cli.COMMANDS)
    assert out[2:] == [""], out
    assert {p.name: p.read_bytes() for p in Path(lib).iterdir()} == before
    assert len(list(Path(bin_dir).iterdir())) == len(slurm_cli.COMMANDS)


def test_where_the_commands_directory_cannot_be_made_they_are_copied_into_the_sandbox(
    launcher: Launcher, payload: Payload, workspace: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    def refused(root: Path, tools_dir: str) -> list[tuple[str, str]]:
        raise OSError(f"{root} is mounted noexec")

    monkeypatch.setattr(slurm_cli, "install_for_sandbox", refused)
    credential = NodeCredential(tmp_path / "credential", "sim01")
    credential.store(signatures.node_key(os.urandom(32), "sim01").hex())
    launcher.credential = credential
    assert launcher.tool_dirs() == [] and len(launcher.tool_links()) == len(slurm_cli.COMMANDS)
    run(launcher, payload, 33, "#!/bin/bash\nsinfo --version\n", workdir=".")
    assert (workspace / "slurm-33.out").read_text().startswith("slurm ")
