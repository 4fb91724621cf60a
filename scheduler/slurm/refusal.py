"""A refused submission, told in Slurm's words: what `sbatch`, `srun` and `salloc`
print when the controller (or sbatch's own check of `--array`/`--dependency`) says no.

Slurm's commands end with one fixed sentence per reason (`Batch job submission failed:
Invalid job array specification`), and tools match it: it is printed as Slurm prints
it, where Slurm prints it. Spur's refusals carry the same sentence, then `: ` and what
exactly was wrong, which follows on a line of its own: always where the request can
never run (SLURM.md: refused with a clear message, e.g. the unknown GPU type named),
otherwise (`'x'` of `--array=x`) only under `-v`. Refusals with no Slurm counterpart
(credit used up, a partition's accounts) are printed whole.
"""

from __future__ import annotations

# The controller's codes whose message starts with Slurm's sentence (scheduler/core:
# arrays, dependencies, lifecycle.check_submission, state._submit, placement).
SLURM_SENTENCE = frozenset(
    {
        "invalid_array",
        "invalid_dependency",
        "invalid_qos",
        "invalid_account",
        "invalid_partition",
        "unsatisfiable",
    }
)
# Each command's words before the sentence (sbatch.c, srun's allocate.c, salloc.c).
FAILED = {
    "sbatch": "Batch job submission failed",
    "srun": "Unable to allocate resources",
    "salloc": "Job submit/allocate failed",
}


def refusal_lines(
    prog: str, message: str, *, code: str = "", partition: str = "", verbose: bool = False
) -> list[str]:
    """stderr's lines (prefix included) for a submission refused with `message`."""
    sentence, detail = message, ""
    if code in SLURM_SENTENCE:
        sentence, _, detail = message.partition(": ")
    lines = []
    if code == "invalid_partition" and partition:
        lines.append(f"{prog}: error: invalid partition specified: {partition}")
    lines.append(f"{prog}: error: {FAILED[prog]}: {sentence}")
    if detail and code == "unsatisfiable":
        lines.append(f"{prog}: error: {detail}")
    elif detail and verbose:  # `'x'` alone would say little: the whole message
        lines.append(f"{prog}: error: {message}")
    return lines
