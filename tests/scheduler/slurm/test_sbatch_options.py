"""sbatch's options from the script, the environment and the command line."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from scheduler.slurm.batchscript import SbatchError
from scheduler.slurm.sbatch_options import SbatchRequest, parse_sbatch
from tests.scheduler.slurm.golden import capture, compares

SCRIPT = """\
#!/bin/bash
#SBATCH -J from-script --time=10 -p script-part
#SBATCH --gres=gpu:mi300x:2 --mem 4G
#SBATCH --mail-type=ALL --mail-user=a@b.c
echo hi
"""


def sbatch(
    *argv: str,
    script: str = SCRIPT,
    environ: Mapping[str, str] | None = None,
    stdin: str = "",
) -> SbatchRequest:
    return parse_sbatch(
        list(argv),
        environ=dict(environ or {}),
        cwd="/home/alice/work",
        read_stdin=lambda: stdin,
        read_file=lambda path: script,
        hostname="vm",
    )


def refused(*argv: str, **kw: object) -> SbatchError:
    with pytest.raises(SbatchError) as caught:
        sbatch(*argv, **kw)  # type: ignore[arg-type]
    return caught.value


def test_a_wrapped_command_becomes_a_job_named_wrap() -> None:
    request = sbatch("--gres=gpu:1", "--wrap", "sleep 2")
    assert request.spec is not None
    assert (
        request.spec.script == "#!/bin/sh\n# This script was created by sbatch --wrap.\n\nsleep 2\n"
    )
    assert request.spec.name == "wrap"
    assert request.spec.gpus_per_node == 1
    # No --chdir: the job runs where sbatch ran, if the workspace holds it.
    assert (request.spec.workdir, request.spec.submit_dir) == ("", "/home/alice/work")
    assert request.spec.submit_host == "vm"
    assert not request.parsable


def test_a_script_file_names_the_job_and_keeps_its_arguments() -> None:
    request = sbatch("/tmp/train.sh", "--lr", "0.1", script="#!/bin/sh\necho\n")
    assert request.spec is not None
    assert request.spec.name == "train.sh"
    assert request.spec.argv == ("--lr", "0.1")


@pytest.mark.parametrize("argv", [(), ("-",), ("/dev/stdin",)])
def test_a_script_can_come_from_stdin(argv: tuple[str, ...]) -> None:
    request = sbatch(*argv, stdin="#!/bin/sh\n#SBATCH -J piped\necho\n")
    assert request.spec is not None
    assert request.spec.name == "piped"


def test_a_script_from_stdin_without_a_name_is_called_sbatch() -> None:
    request = sbatch(stdin="#!/bin/sh\necho\n")
    assert request.spec is not None and request.spec.name == "sbatch"


def test_script_directives_map_onto_the_spec() -> None:
    request = sbatch("job.sh")
    spec = request.spec
    assert spec is not None
    assert (spec.name, spec.time_limit_min, spec.partition) == ("from-script", 10, "script-part")
    assert (spec.gpus_per_node, spec.gpu_type, spec.mem_per_node_mb) == (2, "mi300x", 4096)
    assert request.warnings == [
        "sbatch: warning: --mail-type is not supported yet; ignored",
        "sbatch: warning: --mail-user is not supported yet; ignored",
    ]


def test_the_environment_beats_the_script_and_the_command_line_beats_both() -> None:
    env = {"SBATCH_JOB_NAME": "from-env", "SBATCH_PARTITION": "env-part", "SBATCH_TIMELIMIT": "5"}
    spec = sbatch("job.sh", environ=env).spec
    assert spec is not None
    assert (spec.name, spec.partition, spec.time_limit_min) == ("from-env", "env-part", 5)
    spec = sbatch("-J", "cli", "-t", "1:00:00", "job.sh", environ=env).spec
    assert spec is not None
    assert (spec.name, spec.partition, spec.time_limit_min) == ("cli", "env-part", 60)


def test_every_mapped_option_reaches_the_spec() -> None:
    spec = sbatch(
        "-o",
        "out-%j.log",
        "-e",
        "err.log",
        "-i",
        "in.txt",
        "-D",
        "sub",
        "-A",
        "proj",
        "-q",
        "high",
        "-N",
        "2-4",
        "-n",
        "8",
        "-c",
        "4",
        "--comment",
        "note",
        "--requeue",
        "-G",
        "mi300x:4",
        "--wrap",
        "true",
    ).spec
    assert spec is not None
    assert (spec.stdout, spec.stderr, spec.stdin) == ("out-%j.log", "err.log", "in.txt")
    assert spec.workdir == "/home/alice/work/sub"
    assert (spec.account, spec.qos, spec.comment, spec.requeue) == ("proj", "high", "note", True)
    assert (spec.nodes, spec.ntasks, spec.cpus_per_task) == (2, 8, 4)
    assert (spec.gpus, spec.gpu_type, spec.gpus_per_node) == (4, "mi300x", 0)


def test_no_requeue_wins_when_given_last() -> None:
    spec = sbatch("--requeue", "--no-requeue", "--wrap", "true").spec
    assert spec is not None and spec.requeue is False


@pytest.mark.parametrize(
    ("gres", "count", "gpu_type"),
    [
        ("gpu", 1, ""),
        ("gpu:2", 2, ""),
        ("gpu:mi300x:1", 1, "mi300x"),
        ("gpu:H100", 1, "h100"),
        ("gres:gpu:3", 3, ""),
        ("gpu:0", 0, ""),
    ],
)
def test_gres_forms_give_gpus_per_node(gres: str, count: int, gpu_type: str) -> None:
    spec = sbatch(f"--gres={gres}", "--wrap", "true").spec
    assert spec is not None
    assert (spec.gpus_per_node, spec.gpu_type) == (count, gpu_type)


def test_gpus_per_node_takes_a_type() -> None:
    spec = sbatch("--gpus-per-node=mi300x:8", "--wrap", "true").spec
    assert spec is not None and (spec.gpus_per_node, spec.gpu_type) == (8, "mi300x")


def test_memory_per_cpu_and_per_gpu_become_memory_per_node() -> None:
    spec = sbatch("-n", "4", "-c", "2", "--mem-per-cpu=1G", "--wrap", "true").spec
    assert spec is not None and spec.mem_per_node_mb == 8 * 1024
    spec = sbatch("--gres=gpu:2", "--mem-per-gpu=100", "--wrap", "true").spec
    assert spec is not None and spec.mem_per_node_mb == 200


def test_ntasks_per_node_sets_the_task_count() -> None:
    spec = sbatch("-N", "2", "--ntasks-per-node=4", "--wrap", "true").spec
    assert spec is not None and spec.ntasks == 8


def test_export_chooses_the_environment() -> None:
    env = {"HOME": "/h", "PATH": "/bin", "SECRET": "x"}
    spec = sbatch("--wrap", "true", environ=env).spec
    assert spec is not None and spec.env == env
    spec = sbatch("--export=NONE", "--wrap", "true", environ=env).spec
    assert spec is not None and spec.env == {}
    spec = sbatch("--export=PATH,EXTRA=1", "--wrap", "true", environ=env).spec
    assert spec is not None and spec.env == {"PATH": "/bin", "EXTRA": "1"}
    spec = sbatch("--export=ALL,EXTRA=1", "--wrap", "true", environ=env).spec
    assert spec is not None and spec.env == {**env, "EXTRA": "1"}


def test_the_users_api_token_is_not_carried_into_the_job_unless_named() -> None:
    # A job is untrusted code: `ALL` must not hand it the submitter's credentials.
    env = {"PATH": "/bin", "SPUR_TOKEN": "spur_secret", "SPUR_API_URL": "http://x"}
    for export in ([], ["--export=ALL"], ["--export=ALL,EXTRA=1"]):
        spec = sbatch(*export, "--wrap", "true", environ=env).spec
        assert spec is not None and "SPUR_TOKEN" not in spec.env, export
        assert spec.env["SPUR_API_URL"] == "http://x"
    spec = sbatch("--export=ALL,SPUR_TOKEN", "--wrap", "true", environ=env).spec
    assert spec is not None and spec.env["SPUR_TOKEN"] == "spur_secret"  # asked for by name


def test_sbatch_flags_are_reported() -> None:
    request = sbatch("--parsable", "--wait", "-Q", "-vv", "--wrap", "true")
    assert (request.parsable, request.wait, request.quiet, request.verbose) == (True, True, True, 2)


@pytest.mark.parametrize(
    "option",
    ["--signal=B:USR1@60", "--time-min=10", "--reservation=r"],
)
def test_options_spur_cannot_honour_yet_are_warned_about_not_refused(option: str) -> None:
    argv = [option] if "=" in option else [option, "x"]
    request = sbatch(*argv, "--wrap", "true")
    assert request.spec is not None
    assert len(request.warnings) == 1
    assert request.warnings[0].startswith("sbatch: warning: --")
    assert request.warnings[0].endswith(" is not supported yet; ignored")


@compares(("12_sbatch_invalid_option.txt", "sbatch --bogus-option --wrap true"))
def test_an_unknown_option_is_refused_like_slurm() -> None:
    golden = capture("12_sbatch_invalid_option.txt", "sbatch --bogus-option --wrap true")
    error = refused("--bogus-option", "--wrap", "true")
    assert (error.lines, error.exit_code) == (golden.stderr.splitlines(), golden.exit_code)


@compares(("12_sbatch_invalid_option.txt", "sbatch --time=bogus --wrap true"))
def test_an_invalid_time_is_refused_like_slurm() -> None:
    golden = capture("12_sbatch_invalid_option.txt", "sbatch --time=bogus --wrap true")
    error = refused("--time=bogus", "--wrap", "true")
    assert (error.lines, error.exit_code) == (golden.stderr.splitlines(), golden.exit_code)


@compares(("12_sbatch_invalid_option.txt", "sbatch --gres=gpu:1"))
def test_an_empty_stdin_script_is_refused_like_slurm() -> None:
    golden = capture("12_sbatch_invalid_option.txt", "sbatch --gres=gpu:1")
    error = refused("--gres=gpu:1")
    assert (error.lines, error.exit_code) == (golden.stderr.splitlines(), golden.exit_code)


@pytest.mark.parametrize(
    ("argv", "line", "code"),
    [
        (["--mem=1.5G"], "sbatch: error: Invalid --mem specification", 255),
        (["--mem-per-cpu=lots"], "sbatch: error: Invalid --mem-per-cpu specification", 255),
        (["-N", "x"], "sbatch: error: invalid node count `x'", 255),
        # A count, but none: Slurm's controller refuses it (the Slurm peer's words).
        (
            ["-N", "0"],
            "sbatch: error: Batch job submission failed: Node count specification invalid",
            1,
        ),
        (["-n", "0"], 'sbatch: error: Invalid numeric value "0" for --ntasks.', 1),
        (["-c", "two"], 'sbatch: error: Invalid numeric value "two" for --cpus-per-task.', 1),
        (["--gres=gpu:x:y:z"], "sbatch: error: Invalid --gres specification", 255),
        (["--gres=fpga:1"], "sbatch: error: Invalid generic resource (gres) specification", 1),
        (["-G", "many"], "sbatch: error: Invalid --gpus specification", 255),
        (["--mem-per-gpu=1G"], "sbatch: error: --mem-per-gpu needs GPUs", 255),
        (["--parsable=1"], "sbatch: option '--parsable' doesn't allow an argument", 255),
    ],
)
def test_bad_values_are_refused_with_slurms_words(argv: list[str], line: str, code: int) -> None:
    error = refused(*argv, "--wrap", "true")
    assert error.lines[0].startswith(line)
    assert error.exit_code == code


def test_bad_values_in_the_script_and_environment_are_refused_too() -> None:
    error = refused("job.sh", script="#!/bin/sh\n#SBATCH --time=soon\n")
    assert error.lines == ["sbatch: error: Invalid --time specification"]
    error = refused("job.sh", script="#!/bin/sh\n#SBATCH --bogus\n")
    assert error.lines[0] == "sbatch: unrecognized option '--bogus'"
    error = refused("--wrap", "true", environ={"SBATCH_TIMELIMIT": "later"})
    assert error.exit_code == 255


def test_a_script_without_a_shebang_is_refused_before_its_options() -> None:
    error = refused("job.sh", script="#SBATCH --bogus\necho\n")
    assert error.exit_code == 1
    assert error.lines[0].startswith("sbatch: error: This does not look like a batch script.")


def test_wrap_and_a_script_together_are_refused() -> None:
    error = refused("--wrap", "true", "job.sh")
    assert error.lines == ["sbatch: error: Script arguments not permitted with --wrap option"]


def test_a_missing_script_file_is_refused() -> None:
    with pytest.raises(SbatchError) as caught:
        parse_sbatch(["/nonexistent/job.sh"], environ={}, cwd="/", read_stdin=lambda: "")
    assert caught.value.lines == ["sbatch: error: Unable to open file /nonexistent/job.sh"]
    assert caught.value.exit_code == 1


def test_help_and_version_are_answered_without_a_script() -> None:
    assert sbatch("--version").show == "version"
    assert sbatch("-h").show == "help"
    assert sbatch("--usage").show == "usage"


def test_operands_in_a_directive_are_ignored_with_a_warning() -> None:
    request = sbatch("job.sh", script="#!/bin/sh\n#SBATCH stray -J x\n")
    assert request.spec is not None and request.spec.name == "x"
    assert request.warnings == ["sbatch: warning: ignoring 'stray' in the #SBATCH line 2"]


def test_scheduling_options_map_onto_the_job_spec() -> None:
    request = sbatch(
        "--array=0-15%4",
        "-d",
        "afterok:12:13?afternotok:14",
        "-H",
        "--nice",
        "-C",
        "mi300x&ib",
        "-w",
        "gpu[01-02]",
        "-x",
        "gpu03",
        "--exclusive",
        "-q",
        "spot",
        "--gres=shard:2",
        "--wrap",
        "true",
    )
    spec = request.spec
    assert spec is not None and request.warnings == []
    assert spec.array == "0-15%4"
    assert spec.dependency == "afterok:12:13?afternotok:14"
    assert spec.hold and spec.exclusive
    assert spec.nice == 100  # Slurm's --nice without a value
    assert spec.constraint == "mi300x&ib"
    assert spec.nodelist == ("gpu01", "gpu02")
    assert spec.exclude == ("gpu03",)
    assert spec.qos == "spot"
    assert (spec.shards, spec.gpus_per_node) == (2, 0)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("now+1hour", "2026-11-30T11:00:00"),
        ("now+90", "2026-11-30T10:01:30"),
        ("16:00", "2026-11-30T16:00:00"),
        ("09:00", "2026-12-01T09:00:00"),  # passed today: tomorrow
        ("2026-12-24T08:30", "2026-12-24T08:30:00"),
        ("tomorrow", "2026-12-01T00:00:00"),
    ],
)
def test_begin_takes_slurms_time_forms(value: str, expected: str) -> None:
    from datetime import datetime

    now = datetime(2026, 11, 30, 10, 0, 0).astimezone()
    request = parse_sbatch(
        [f"--begin={value}", "--wrap", "true"], environ={}, cwd="/", read_stdin=str, now=now
    )
    assert request.spec is not None and request.spec.begin_time is not None
    begin = datetime.fromtimestamp(request.spec.begin_time).astimezone(now.tzinfo)
    assert begin.strftime("%Y-%m-%dT%H:%M:%S") == expected


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("--array=5-1", "Invalid job array specification"),
        ("--dependency=afterfoo:1", "Job dependency problem"),
        ("--begin=someday", "Invalid time specification"),
        ("--nice=lots", "Invalid --nice"),
        ("--nodelist=gpu[01-", "Invalid --nodelist"),
    ],
)
def test_malformed_scheduling_options_are_refused(option: str, message: str) -> None:
    with pytest.raises(SbatchError) as caught:
        sbatch(option, "--wrap", "true")
    assert message in "\n".join(caught.value.lines)


@pytest.mark.parametrize(
    ("option", "sentence", "detail"),
    [
        ("--array=x", "Invalid job array specification", "'x'"),
        ("--array=0-99999999", "Invalid job array specification", "task ids must be below"),
        ("--dependency=bogus:1", "Job dependency problem", "unknown kind 'bogus' in 'bogus:1'"),
        ("--dependency=afterok", "Job dependency problem", "afterok needs job ids"),
    ],
)
def test_a_bad_array_or_dependency_stops_where_slurms_sentence_stops(
    option: str, sentence: str, detail: str
) -> None:
    # Slurm 22.05 (the Slurm peer) says no more than the sentence, even under -v.
    error = refused(option, "--wrap", "true")
    assert (error.lines, error.exit_code) == (
        [f"sbatch: error: Batch job submission failed: {sentence}"],
        1,
    )
    # Ours says what was wrong under -v, on a line after it; -v may come after the option.
    error = refused(option, "--wrap", "true", "-v")
    assert error.lines[0] == f"sbatch: error: Batch job submission failed: {sentence}"
    assert error.lines[1].startswith(f"sbatch: error: {sentence}: ") and detail in error.lines[1]


def test_options_are_checked_before_the_array_and_dependency_as_in_slurm() -> None:
    # In Slurm the controller checks those; a bad --time never gets that far (exit 255).
    error = refused("--array=x", "-N", "0", "--time=bogus", "--wrap", "true")
    assert (error.lines, error.exit_code) == (["sbatch: error: Invalid --time specification"], 255)


def test_the_body_sbatch_sends_names_the_contracts_fields_only() -> None:
    """sbatch builds the JobSpec's JSON itself (the contract is not imported at its
    start): every key it can send is a field of the contract's JobSpec that a submitter
    sets (not `tenant` or `user`, which the token stamps), and the contract reads it."""
    from scheduler.core.contract import SPEC_FIELDS, JobSpec

    request = sbatch(
        "-N", "2", "-n", "4", "-c", "2", "--gres=gpu:mi300x:1", "--mem-per-cpu=1G",
        "-t", "10", "-p", "gpu", "-A", "a", "-q", "high", "-J", "n", "-o", "o", "-e", "e",
        "-i", "i", "-D", "sub", "--comment", "c", "--requeue", "-a", "0-3", "-d",
        "afterok:1", "-H", "--begin", "now+60", "--nice=5", "-C", "f", "-w", "n[1-2]",
        "-x", "n3", "--exclusive", "--export=ALL", "job.sh", "arg",
    )  # fmt: skip
    assert request.body is not None
    settable = {f.name for f in SPEC_FIELDS if not f.bounds.stamped}
    assert set(request.body) <= settable
    assert set(request.body) >= settable - {"gpu_milli", "interactive"}  # all it can set
    spec = JobSpec.from_dict(request.body)
    wire = spec.to_dict()  # the body is already the contract's wire form of the spec
    assert {key: wire[key] for key in request.body} == request.body
    assert (spec.nodes, spec.mem_per_node_mb, spec.nodelist) == (2, 4 * 1024, ("n1", "n2"))


def test_a_spec_the_contract_refuses_is_left_to_the_server_to_refuse() -> None:
    """sbatch checks its options' syntax with Slurm's words; the contract's bounds are
    the server's to check (one place), whose refusal sbatch prints as Slurm prints a
    refused submission (tests/scheduler/cli/test_sbatch.py)."""
    from scheduler.core.errors import InvalidSpec

    request = sbatch("-J", "x" * 300, "--wrap", "true")
    assert request.body is not None and request.body["name"] == "x" * 300
    with pytest.raises(InvalidSpec, match="name is longer than 200"):
        request.spec  # noqa: B018 - reading the body as the contract (the server) does
