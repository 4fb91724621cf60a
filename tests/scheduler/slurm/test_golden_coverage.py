"""Every case of the Slurm 22.05 captures (each `$ command` block of each file of
../shared/reference/slurm-golden/) is compared with our output by some test, after
normalising ids, times and names (`@golden.compares`), or is a difference listed here
with its reason; a listed difference that our output can show has a test that shows it
(`@golden.differs`) and fails once it is gone. A case both compared and listed fails:
the listing is stale.

`sacct`'s `N.extern` rows: the captured cluster ran without `PrologFlags=contain` and
printed none (files 40-43, 60-63), so neither do we (docs/architecture.md, "Job steps");
the cases that show steps are compared as they are.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from tests.scheduler.cli.test_golden_commands import CONFIG, VERSIONS
from tests.scheduler.slurm import golden
from tests.scheduler.slurm.golden import GOLDEN_DIR, Case

TESTS = Path(__file__).resolve().parents[2]
# A reason that starts so names a case our output cannot show at all (not a command of
# ours, or a state a Spur cluster is never in): nothing can tell when it is gone.
NOT_OURS = "not ours: "

_F13 = "13_sbatch_unsatisfiable_gres.txt"
_NEVER = (
    "never runnable: Slurm's sentence is our first line; ours then says why (SLURM.md, "
    "'Where we choose to differ': refused with a clear message), where Slurm says why only "
    "for memory and CPUs, before it"
)
_REFUSED_KEPT = (
    "Slurm keeps a record of each refused submission (FAILED 1:0: jobs 4-6, 8, 9) and the "
    "-N5 job 7; Spur makes no job of a refused one (SLURM.md), so a history of the same "
    "work lacks those rows: the rows of the jobs that ran are Slurm's (test_sacct_format "
    "HISTORY, test_sacct_steps)"
)
_RESTD = (
    NOT_OURS + "slurmrestd v0.0.38, whose answers Slurm 22.05 shapes after its own OpenAPI "
    "v0.0.38; Spur serves v0.0.40-42 (SLURM.md) and tests/spurcloud/test_slurmrestd*.py "
    "check those against ../shared/reference/slurmrestd/"
)
_GRES_CONF = (
    NOT_OURS + "a Slurm misconfiguration (gres.conf without File=, nodes INVALID); a Spur "
    "agent reports the GPUs it finds, and no node state reads inval"
)
_ENV = (
    "equal for each variable that comes from the job; slurmd and srun also put what they "
    "know of themselves (SLURM_CONF, SLURM_JOB_UID/GID, SLURM_TASK_PID, SLURM_TOPOLOGY_*, "
    "ports and addresses), and we add SLURM_NTASKS and the like: "
    "test_jobenv/test_step_env name both sets"
)

DIFFERENCES: dict[Case, str] = {
    (_F13, "sbatch --gres=gpu:9 --wrap true"): _NEVER,
    (_F13, "sbatch --parsable --gres=gpu:9 --wrap true"): _NEVER,
    (_F13, "sbatch --gres=gpu:h100:1 --wrap true"): _NEVER,
    (_F13, "sbatch --mem=600G --wrap true"): _NEVER,
    (_F13, "sbatch -c 65 --wrap true"): _NEVER,
    ("53_srun_direct.txt", "srun --gres=gpu:9 true"): _NEVER,
    (_F13, "sbatch -N5 --gres=gpu:1 --wrap true"): (
        "more nodes than the partition has: refused at submit (EnforcePartLimits=ALL, "
        "SLURM.md); Slurm's default queues it for ever (PartitionNodeLimit)"
    ),
    **{
        ("26_pending_reasons.txt", f"scontrol show job {i}"): (
            "a pending job without --mem has no memory yet: Spur decides it at placement, "
            "so its TRES lacks mem= and it reads MinMemoryNode=0 (test_golden_scontrol); "
            "job 15's unmet dependency leaves Slurm's EligibleTime Unknown, ours is its "
            "submit time"
        )
        for i in (13, 14, 15)
    },
    ("27_sinfo_busy.txt", "sinfo -N -o '%N %t %G %C %m %e'"): (
        "FREE_MEM is the operating system's figure, which a Spur agent does not report: N/A"
    ),
    ("41_job_array.txt", "squeue -r -o '%i %A %F %K %j %T %R'"): (
        "Spur gives each array task its own job id at submit (17-20); Slurm's waiting tasks "
        "share the array's record (17) until each starts"
    ),
    ("41_job_array.txt", "squeue --array -j 17 -O JobID,ArrayJobID,ArrayTaskID,State,Reason"): (
        "as for -r: each waiting task has its own JobID"
    ),
    ("41_job_array.txt", "scontrol show job 17 | grep -E '^JobId|ArrayTaskThrottle|JobState'"): (
        "each waiting task is its own record (ArrayTaskId=0, 1, ...), not Slurm's one "
        "record of the waiting remainder (ArrayTaskId=0-3%2)"
    ),
    ("50_env_gpu2.txt", "cat env_gpu2.out"): _ENV,
    ("51_env_2node_srun.txt", "cat env_2node.out"): _ENV,
    ("52_env_gpus_option.txt", "cat env_gpus3.out"): _ENV,
    ("51_env_2node_srun.txt", "cat env2node.sh"): (
        NOT_OURS + "the script the next case submits, as written by the user"
    ),
    **{
        ("54_gres_without_File_fails.txt", c): _GRES_CONF
        for c in (
            "cat /etc/slurm/gres.conf",
            "sinfo -R",
            "sinfo -N",
            "scontrol show node gpu02 | grep -E 'Gres|State|Reason'",
            "sbatch --gres=gpu:1 --wrap true",
        )
    },  # fmt: skip
    ("60_sacct_default.txt", "sacct"): _REFUSED_KEPT,
    ("61_sacct_parsable_format.txt", "sacct -P --format=JobID,JobName,State,ExitCode,Elapsed"): (
        _REFUSED_KEPT
    ),
    ("62_sacct_X_n.txt", "sacct -X -n"): _REFUSED_KEPT,
    ("64_sacctmgr.txt", "sacctmgr -n show cluster"): (
        "the controllers' address is not shown to tenants (ControlHost blank)"
    ),
    ("70_versions.txt", VERSIONS): (
        "the captured Slurm is Debian's build, which calls itself slurm-wlm; ours says "
        "slurm 22.05.8 as upstream Slurm does"
    ),
    ("70_versions.txt", CONFIG): (
        "the scheduler's own plugins (accounting_storage/spurcloud, priority/multifactor) "
        "and no slurmd plugins (Proctrack, Task, Topology) or MaxJobCount; GresTypes, "
        "MinJobAge, SchedulerType and SelectType are Slurm's"
    ),
    ("80_slurmrestd.txt", "scontrol token lifespan=900 | sed 's/=.*/=<token>/'"): (
        NOT_OURS + "Spur's tokens are the portal's API tokens (`spur token`), not scontrol's JWTs"
    ),
    **{
        (name, item.command): _RESTD
        for name in ("80_slurmrestd.txt", "81_slurmrestd_nodes.txt")
        for item in (golden.captures(name) if GOLDEN_DIR.exists() else [])
        if item.command.startswith("curl ")
    },
}


def all_cases() -> list[Case]:
    if not GOLDEN_DIR.exists():
        return []
    return [
        (path.name, item.command)
        for path in sorted(GOLDEN_DIR.glob("*.txt"))
        if path.name != "README.md"
        for item in golden.captures(path.name)
    ]


def _load_claims() -> None:
    """Import every test module that claims cases, so that its claims are known."""
    for path in sorted(TESTS.rglob("test_*.py")):
        text = path.read_text()
        if "@compares(" in text or "@differs(" in text:
            module = ".".join(path.relative_to(TESTS.parent).with_suffix("").parts)
            importlib.import_module(module)


_load_claims()
CASES = all_cases()


@pytest.mark.parametrize("case", CASES, ids=[f"{f}::{c}" for f, c in CASES])
def test_each_case_is_compared_or_a_listed_difference(case: Case) -> None:
    compared = golden.COMPARED.get(case)
    listed = DIFFERENCES.get(case)
    assert compared or listed, f"{case} is neither compared by a test nor listed in DIFFERENCES"
    assert not (compared and listed), f"{case} is listed as a difference, yet {compared} compare it"
    if listed and not listed.startswith(NOT_OURS):
        assert case in golden.DIFFERING, f"no test shows the difference of {case}: {listed}"


def test_the_claims_and_the_table_name_real_cases() -> None:
    if not CASES:
        pytest.skip("the golden files are not available")
    known = set(CASES)
    for table in (golden.COMPARED, golden.DIFFERING, DIFFERENCES):
        assert sorted(set(table) - known) == []
    # A difference shown by a test is listed with its reason.
    assert sorted(set(golden.DIFFERING) - set(DIFFERENCES)) == []


def test_the_files_hold_the_cases_this_table_was_made_for() -> None:
    if not CASES:
        pytest.skip("the golden files are not available")
    assert (len({f for f, _ in CASES}), len(CASES)) == (41, 129)
