"""srun's command line, --export, output patterns, -i and --pty rules (scheduler/cli/srun.py),
and that the step client needs nothing but the standard library: the one in every job's
sandbox (/run/spur/bin/srun, the CLI bundle's) runs under the system's python3 with no
platform package."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agents import slurm_cli
from scheduler.cli import srun, stepout
from scheduler.cli.salloc import holder_argv


def test_options_stop_at_the_command_which_keeps_its_own():
    opts = srun.parse(["-l", "-n4", "-N", "2", "--cpu-bind=cores", "bash", "-c", "echo -n"])
    assert opts.values == {"label": True, "ntasks": 4, "nodes": 2, "cpu_bind": "cores"}
    assert opts.argv == ["bash", "-c", "echo -n"]
    assert srun.parse(["--ntasks-per-node=2", "--", "-x"]).argv == ["-x"]
    assert srun.parse(["--gpus-per-t", "1", "x"]).values == {"gpus_per_task": 1}
    assert srun.parse(["-N", "2-4", "x"]).values == {"nodes": 2}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--bogus", "x"], "srun: unrecognized option '--bogus'"),
        (["-Z", "x"], "srun: invalid option -- 'Z'"),
        (["-n"], "srun: option requires an argument -- 'n'"),
        (["-n", "zero", "x"], 'srun: error: Invalid numeric value "zero" for --ntasks.'),
        (["--cpu-bind=bogus", "x"], "srun: error: Invalid --cpu-bind argument: bogus"),
    ],
)
def test_bad_options_get_sruns_words(argv, message):
    with pytest.raises(srun.Usage) as bad:
        srun.parse(argv)
    assert str(bad.value).startswith(message)


def test_an_unknown_option_exits_255_and_a_missing_command_is_fatal(capsys):
    # Slurm 22.05's srun exits 255 for what getopt refuses (checked on the Slurm peer).
    assert srun.main(["--bogus"]) == 255
    assert srun.main(["--array=x", "true"]) == 255
    assert srun.main(["-l"]) == 1
    assert "srun: fatal: No command given to execute." in capsys.readouterr().err


def test_unsupported_mpi_warns_and_runs_anyway():
    opts = srun.parse(["--mpi=openmpi", "--pty", "x"])
    assert opts.warnings == ["srun: warning: --mpi=openmpi is not supported: using none"]
    assert opts.values["pty"] is True
    assert srun.parse(["--mpi=none", "x"]).warnings == []


@pytest.mark.parametrize("given", [["-i", "none"], ["-o", "out"], ["--error=err"]])
def test_pty_with_input_output_or_error_is_refused_in_slurms_words(given, capsys):
    # Slurm 22.05.8 on the peer: `srun --pty -i none true` and `srun --pty -o x true`.
    assert srun.main(["--pty", *given, "true"]) == 1
    assert capsys.readouterr().err == (
        "srun: error: --error/--input/--output are incompatible with --pty\n"
    )


def test_pty_without_a_terminal_says_so_as_slurm_and_runs_without_one(capsys):
    # The peer's words when srun's stdout is not a terminal; the step runs without one.
    opts = srun.parse(["--pty", "tty"])
    assert srun._terminal(opts) is False  # pytest's stdout is not a terminal
    assert capsys.readouterr().err == (
        "srun: error: ioctl(TIOCGWINSZ): Inappropriate ioctl for device\n"
        "srun: error: Not using a pseudo-terminal, disregarding --pty option\n"
    )


def test_pty_on_a_terminal_asks_for_one_of_its_size():
    import pty as ptys

    from scheduler.cli import stepio

    master, slave = ptys.openpty()
    try:
        from agents.step_io import set_size

        set_size(master, 132, 43)
        assert stepio.window_size(slave) == (132, 43)
    finally:
        os.close(master)
        os.close(slave)
    opts = srun.parse(["--pty", "bash"])
    opts.values["pty_size"] = (132, 43)
    body = srun.step_request(opts)
    assert body["pty"] == [132, 43]
    assert body["env"]["SLURM_UNBUFFEREDIO"] == "1"  # Slurm: --pty implies --unbuffered


def test_export_all_none_and_lists():
    env = {"A": "1", "B": "2"}
    assert srun.export_environment(None, env) == env
    assert srun.export_environment("ALL", env) == env
    assert srun.export_environment("NONE", env) == {}
    assert srun.export_environment("A,C=3", env) == {"A": "1", "C": "3"}
    assert srun.export_environment("ALL,C=3", env) == {"A": "1", "B": "2", "C": "3"}


def test_output_patterns():
    kw = {"job_id": "42", "step_id": 1, "node": "sim02", "node_id": 1}
    assert stepout.expand("out-%j-%t.txt", rank=3, **kw) == "out-42-3.txt"
    assert stepout.expand("%J.%n.%N.%3t.%%", rank=3, **kw) == "42.1.1.sim02.003.%"
    assert stepout.expand("a\\%t", rank=3, **kw) == "a%t"
    assert stepout.per_task("x-%t")
    assert not stepout.per_task("x-%%t") and not stepout.per_task("x-%j")


def test_labels_pad_to_the_widest_rank_and_keep_partial_lines(tmp_path: Path):
    path = tmp_path / "out"
    with open(path, "wb") as handle:
        sink = stepout._Sink(handle, label=True, width=2)
        sink.write(3, b"a\nb")
        sink.write(10, b"c\n")
        sink.write(3, b"c\n")
        sink.write(3, b"tail")
        sink.finish(3)
    assert path.read_bytes() == b" 3: a\n10: c\n 3: bc\n 3: tail\n"


def test_input_goes_to_every_task_unless_one_or_none_is_named(tmp_path: Path, monkeypatch):
    # Slurm 22.05.8 on the peer: `echo x | srun -n2 -l cat` prints "0: x" and "1: x".
    assert stepout.input_mode(None) == "all"
    assert stepout.input_mode("all") == "all"
    assert stepout.input_mode("none") == "none"
    assert stepout.input_mode("1") == 1
    assert srun.step_request(srun.parse(["-n2", "cat"]))["input"] == "all"
    assert srun.step_request(srun.parse(["-i", "1", "-n2", "cat"]))["input"] == 1
    # Where srun reads it from: its stdin, nothing, or a file it sends to every task.
    assert srun.input_source(srun.parse(["cat"])) == 0
    assert srun.input_source(srun.parse(["-i", "none", "cat"])) is None
    (tmp_path / "in.txt").write_text("data\n")
    monkeypatch.chdir(tmp_path)
    opts = srun.parse(["-i", "in.txt", "cat"])
    fd = srun.input_source(opts)
    assert fd is not None and os.read(fd, 100) == b"data\n"
    os.close(fd)
    assert srun.step_request(opts)["input"] == "all"
    with pytest.raises(srun.Failed, match="^Could not open stdin file: No such file or directory$"):
        srun.input_source(srun.parse(["-i", "missing.txt", "cat"]))


def test_the_sandboxed_client_runs_on_the_standard_library_alone(tmp_path: Path):
    # As a sandbox runs it: the CLI bundle's srun, the host's bare python3.
    pyz = tmp_path / "slurm-cli.pyz"
    pyz.write_bytes(slurm_cli.bundle())
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "5"}
    # -I -S: no site-packages, no platform package on the path.
    ran = subprocess.run(
        ["/usr/bin/python3", "-I", "-S", str(pyz), "srun", "hostname"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    # Without the job's step credential it needs the web API's, like salloc's command.
    assert ran.returncode == 1
    assert ran.stderr.startswith("srun: error: no Spur API configured: set SPUR_API_URL")
    version = subprocess.run(
        ["/usr/bin/python3", "-I", "-S", str(pyz), "srun", "--version"],
        capture_output=True,
        text=True,
    )
    assert version.stdout == "slurm 22.05.8\n"
    assert "scheduler" not in os.environ.get("PYTHONPATH", "")
    # What it imports is the standard library's and its own.
    code = (
        f"import sys; sys.path.insert(0, {str(pyz)!r}); import scheduler.cli.srun, "
        "scheduler.cli.stepio; print(sorted({m.split('.')[0] for m in sys.modules} - "
        "set(sys.stdlib_module_names) - {'__main__'}))"
    )
    imported = subprocess.run(
        ["/usr/bin/python3", "-I", "-S", "-c", code], capture_output=True, text=True
    )
    assert imported.stdout.strip() == "['scheduler']", imported.stderr


def test_the_allocation_of_salloc_is_a_holder_job_with_sbatchs_options():
    opts = srun.parse(["-N2", "--gres=gpu:1", "-p", "gpu", "-t", "5", "sh"])
    argv = holder_argv(opts, "sh")
    assert argv[:-2] == [
        "--nodes=2",
        "--job-name=sh",
        "--partition=gpu",
        "--time=5",
        "--gres=gpu:1",
        "--output=/dev/null",
    ]
    assert argv[-2] == "--wrap"
    per_task = holder_argv(srun.parse(["-n2", "--gpus-per-task=2", "x"]), "x")
    assert "--gpus=4" in per_task


@pytest.mark.parametrize("module", ["scheduler.cli.srun", "scheduler.cli.salloc"])
def test_srun_and_salloc_start_without_heavy_modules(module: str) -> None:
    code = (
        f"import sys, {module}; "
        "print(sorted(m for m in ('httpx', 'tenacity', 'django', 'hostlist') if m in sys.modules))"
    )
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert ran.stdout.strip() == "[]"


def test_cpu_bind_cores_gives_each_task_its_share_of_the_jobs_cpus():
    from agents.step_launch import task_cpus

    job = frozenset({4, 5, 6, 7})
    cores = {"cpu_bind": "cores", "cpus_per_task": 2}
    assert task_cpus(job, cores, 0, 2) == {4, 5}
    assert task_cpus(job, cores, 1, 2) == {6, 7}
    # More than the allocation holds, unknown CPUs, or none asked: the job's CPUs.
    assert task_cpus(job, cores, 2, 3) == job
    assert task_cpus(frozenset(), cores, 0, 1) == frozenset()
    assert task_cpus(job, {"cpu_bind": "none"}, 1, 2) == job
    assert (
        srun.step_request(srun.parse(["--cpu-bind=verbose,cores", "-i", "none", "x"]))["cpu_bind"]
        == "cores"
    )
    assert (
        srun.step_request(srun.parse(["--cpu-bind=none", "-i", "none", "x"]))["cpu_bind"] == "none"
    )


@pytest.fixture
def outside(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SLURM_JOB_ID", "SLURM_JOBID", "SPUR_STEP_TOKEN", "SPUR_STEP_URL"):
        monkeypatch.delenv(name, raising=False)


def test_outside_an_allocation_bad_input_gets_slurms_words_and_exit_codes(
    fake_api, outside, capsys
):
    # The Slurm peer's (22.05.8) answers; nothing reaches the server.
    from scheduler.cli import salloc

    for main, prog in ((srun.main, "srun"), (salloc.main, "salloc")):
        assert main(["--time=bogus", "true"]) == 255
        assert capsys.readouterr().err == f"{prog}: error: Invalid --time specification\n"
        assert main(["--mem=1.5G", "true"]) == 255
        assert capsys.readouterr().err == f"{prog}: error: Invalid --mem specification\n"
        assert main(["--gres=bogus:1", "true"]) == 1
        assert capsys.readouterr().err == (
            f"{prog}: error: Invalid generic resource (gres) specification\n"
        )
    assert srun.main(["-N", "0", "true"]) == 1
    assert capsys.readouterr().err == (
        "srun: error: Unable to allocate resources: Node count specification invalid\n"
    )
    assert salloc.main(["-N", "0", "true"]) == 1
    assert capsys.readouterr().err == (
        "salloc: error: Job submit/allocate failed: Node count specification invalid\n"
    )
    assert fake_api.requests == []


def test_outside_an_allocation_a_refusal_creates_nothing_and_says_so_as_slurm(
    fake_api, outside, capsys
):
    from scheduler.cli import salloc

    fake_api.refuse_submit = "Invalid partition name specified"
    fake_api.refuse_submit_code = "invalid_partition"
    assert srun.main(["-p", "nosuchpart", "true"]) == 1
    assert capsys.readouterr().err == (
        "srun: error: invalid partition specified: nosuchpart\n"
        "srun: error: Unable to allocate resources: Invalid partition name specified\n"
    )
    fake_api.refuse_submit = (
        "Requested node configuration is not available: "
        "9 GPUs per node requested, the largest node has 8"
    )
    fake_api.refuse_submit_code = "unsatisfiable"
    assert salloc.main(["--gres=gpu:9", "true"]) == 1
    # Slurm also says "Job allocation N has been revoked.": it made a job; we make none.
    assert capsys.readouterr().err == (
        "salloc: error: Job submit/allocate failed: Requested node configuration is not available\n"
        "salloc: error: 9 GPUs per node requested, the largest node has 8\n"
    )
    assert fake_api.jobs == {}
