"""The Slurm CLI's cost, whole process, as a user pays it.

Starts the embedded platform the way bench/e2e.py does (SQLite, file-system broker, one
controller, four simulated 8-GPU nodes), then times, as the medians of RUNS runs of the
installed console scripts (fresh processes, with the user's token in SPUR_API_URL /
SPUR_TOKEN):

  floor    `python -c pass` with the venv's interpreter (what any Python command pays),
           with the same environment as the commands (bytecode cached, see `run`), timed
           right after each timed run of each command below: each command's ratio
           divides by the floor beside its own runs (the machine's speed drifts)
  sbatch   `sbatch --wrap true`
  loop     100 `sbatch --wrap true` one after another, as a shell loop runs them (jobs/s)
  sacct    `sacct` over the history with 10,000 finished jobs in it (plus the ones above),
           read again and again as tools poll it; and each run just after a change (one
           more held job submitted, untimed), which the web's kept answers
           (spurcloud/jobs/kept.py) cannot serve
  squeue   `squeue` with 10,000 jobs queued (held: `sbatch -H`, so they stay PENDING),
           read again and again as tools poll it; and each run just after a change (one
           more held job submitted, untimed), which the controller's kept answers
           (scheduler/ctld/reads.py) cannot serve

The history's 10,000 finished jobs are written straight into the history table (as the
controller's events would write them: `jobobject.record_fields` of the core's own job
dict, COMPLETED), since running 10,000 jobs through the simulated nodes first would take
this machine many minutes and measure the scheduler, not the CLI. The 10,000 queued jobs
are real submissions through the web API (bulk lists of 100, several at a time), so the
controller holds them as squeue reads them.

For the bench only, the web's rate limits (API_REQUESTS_PER_MINUTE_PER_TOKEN/_PER_IP,
API_SUBMISSIONS_PER_MINUTE_PER_ORGANIZATION) are raised through the environment and the
controller's per-organisation cap (`[scheduler] max_submit_jobs_per_account`) is lifted
(0) in the spur.toml the bench writes: the defaults would refuse 10,000 submissions in a
few minutes from one token, as they should in production.

If the Slurm peer (../shared/peers/slurm) is up (SLURM_CONF at /tmp/slurmpeer), the same
`sbatch`, `squeue` and `sacct` are timed there too; otherwise its figures are null.

    python bench/cli.py
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from embedded import on_platform  # noqa: E402

from spurcloud.stack import BIN, Stack  # noqa: E402

RUNS = 11
LOOP = 100
MANY = 10_000
BULK = 100  # the web's default API_MAX_BULK_SUBMIT
NODES = [(f"node{i:02d}", "mi300x-8") for i in range(1, 5)]
PYTHON = str(BIN / "python")
SLURM_CONF = Path("/tmp/slurmpeer/etc/slurm.conf")
HISTORY_BASE_ID = 50_000_000  # the written history's ids: far above what the controller gives
LIMITS = {
    "API_REQUESTS_PER_MINUTE_PER_TOKEN": "10000000",
    "API_REQUESTS_PER_MINUTE_PER_IP": "10000000",
    "API_SUBMISSIONS_PER_MINUTE_PER_ORGANIZATION": "10000000",
}

FILL_HISTORY = """
import time
from django.conf import settings
from scheduler.core.contract import JobSpec
from scheduler.core.jobs import Job
from spurcloud.jobs import jobobject
from spurcloud.jobs.models import JobRecord
from spurcloud.tenants.models import Organization

slug, user, base, count = {args}
organization = Organization.objects.get(slug=slug)
now = time.time()
rows = []
for i in range(count):
    spec = JobSpec(script="#!/bin/sh\\ntrue\\n", name=f"done-{i}", tenant=slug, user=user,
                   workdir="/tmp", gpus_per_node=1, stdout="/dev/null", stderr="/dev/null")
    job = Job(job_id=base + i, spec=spec, partition="gpu", account=slug, time_limit_min=60,
              submit_time=now - 60, eligible_time=now - 60)
    out = job.to_dict(dependency="(null)")
    out.update(state="COMPLETED", reason="None", start_time=now - 50, end_time=now - 40,
               exit_code=0, signal=0, nodes=["node01"], num_nodes=1)
    rows.append(JobRecord(cluster=settings.SPUR_CLUSTER_NAME, job_id=base + i,
                          organization=organization, last_seq=0,
                          **jobobject.record_fields(out)))
JobRecord.objects.bulk_create(rows, batch_size=500)
print(JobRecord.objects.filter(organization=organization).count())
"""


# `python -c pass` timed right after each timed run of a command (`median_ms(key=...)`):
# this machine's speed drifts within a run (a neighbour's load), and a floor timed at
# another moment than the command it divides made the same command 4.7x or 7.8x of it.
FLOOR = [PYTHON, "-c", "pass"]
floors: dict[str, list[float]] = {}  # figure's key -> the floor's times beside its runs


def _timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = (time.perf_counter() - t0) * 1000
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.decode()[-500:]}")
    return elapsed


def median_ms(
    argv: list[str],
    env: dict[str, str],
    runs: int = RUNS,
    before: Callable[[], None] | None = None,
    key: str | None = None,
) -> float:
    """The median wall time of `runs` runs of `argv`, `before` called (untimed) before
    each one; with `key`, the floor timed after each run too (`floors[key]`)."""
    times = []
    for _ in range(runs):
        if before is not None:
            before()
        times.append(_timed(argv, env))
        if key is not None:
            floors.setdefault(key, []).append(_timed(FLOOR, env))
    return statistics.median(times)


def floor_of(key: str) -> float:
    """The floor beside a figure's runs (the median of its own floor samples)."""
    return statistics.median(floors[key])


def polled(
    stack: Stack,
    creds: dict[str, str],
    env: dict[str, str],
    command: str,
    name: str,
    figures: dict[str, float | None],
) -> None:
    """`command` timed as tools poll it (`<name>_ms`: nothing changes between reads) and
    each run just after a change (`<name>_changed_ms`: one more held job, untimed)."""
    median_ms([command], env, runs=1)  # warm-up
    figures[f"{name}_ms"] = median_ms([command], env, key=f"{name}_ms")
    figures[f"{name}_changed_ms"] = median_ms(
        [command],
        env,
        before=lambda: submit_held(stack, creds["token"], 1, workers=1),
        key=f"{name}_changed_ms",
    )


def settle(squeue: str, env: dict[str, str], timeout_s: float = 120) -> None:
    """Waits until no job is pending, running or completing, and a little longer for the
    worker to mirror their last events into the history."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        active = subprocess.run([squeue, "-h", "-t", "PD,R,CG"], env=env, check=True,
                                capture_output=True, text=True).stdout.strip()  # fmt: skip
        if not active:
            time.sleep(2)
            return
        time.sleep(0.5)
    raise RuntimeError("the loop's jobs did not end")


def main() -> int:
    config = "\n[scheduler]\nmax_submit_jobs_per_account = 0\n"
    return on_platform("spur-bench-cli-", NODES, run, env=LIMITS, config=config)


def submit_held(stack: Stack, token: str, count: int, workers: int = 4) -> None:
    """`count` held jobs through the web API, in bulk submissions (a list of at most
    BULK specs a request) from `workers` clients at once."""
    spec = {"script": "#!/bin/sh\ntrue\n", "name": "held", "hold": True, "stdout": "/dev/null"}
    headers = {"Authorization": f"Bearer {token}"}

    def submit(share: int) -> None:
        with httpx.Client(base_url=stack.web_url, headers=headers, timeout=60) as web:
            while share > 0:
                batch = min(share, BULK)
                web.post("/api/v1/jobs", json=[spec] * batch).raise_for_status()
                share -= batch

    shares = [count // workers + (1 if i < count % workers else 0) for i in range(workers)]
    with ThreadPoolExecutor(workers) as pool:
        for future in [pool.submit(submit, n) for n in shares]:
            future.result()


def run(stack: Stack, creds: dict[str, str]) -> int:
    # Submit from the platform's own folder: the jobs write slurm-N.out where they were
    # submitted, which must not be the checkout.
    os.chdir(stack.state_dir)
    env = dict(os.environ)
    env.update(SPUR_API_URL=stack.web_url, SPUR_TOKEN=creds["token"])
    env.pop("SPUR_USER", None)
    # As an installed CLI runs: its modules' bytecode cached (pip compiles it at install),
    # even where the environment says not to write any (PYTHONDONTWRITEBYTECODE=1 made
    # every run compile the project's modules anew). The warm-up runs write it.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(stack.state_dir / "pycache")
    tool = {name: str(BIN / name) for name in ("sbatch", "squeue", "sacct")}
    figures: dict[str, float | None] = {}

    median_ms(["true"], env, runs=3)  # warm the page cache for what follows
    median_ms(FLOOR, env, runs=2)  # its bytecode cached
    median_ms([tool["sbatch"], "--wrap", "true"], env, runs=2)  # the web's first requests
    figures["sbatch_ms"] = median_ms([tool["sbatch"], "--wrap", "true"], env, key="sbatch_ms")

    t0 = time.perf_counter()
    for _ in range(LOOP):
        subprocess.run([tool["sbatch"], "--wrap", "true"], env=env, check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
    figures["sbatch_loop_jobs_per_s"] = LOOP / (time.perf_counter() - t0)

    # The loop's jobs end (and their last events reach the history) before the history is
    # read: "10,000 finished jobs" is a history that does not change while it is timed
    # (the row after it times one that does).
    settle(tool["squeue"], env)
    args = (creds["organization"], "admin", HISTORY_BASE_ID, MANY)  # seed_demo's user
    t_fill = time.perf_counter()
    written = stack.manage("shell", "-c", FILL_HISTORY.replace("{args}", repr(args)))
    history = int(written.strip().splitlines()[-1])
    fill_history_s = time.perf_counter() - t_fill
    # Polled unchanged, and each read just after a change to the history (one more held
    # job): the web keeps no answer of an older history version (spurcloud/jobs/kept.py).
    polled(stack, creds, env, tool["sacct"], "sacct_10k", figures)

    t_fill = time.perf_counter()
    submit_held(stack, creds["token"], MANY)
    fill_queue_s = time.perf_counter() - t_fill
    queued = subprocess.run([tool["squeue"], "-h", "-t", "PD"], env=env, check=True,
                            capture_output=True, text=True).stdout.count("\n")  # fmt: skip
    # The same for the queue: the controller keeps no answer of an older state
    # (scheduler/ctld/reads.py).
    polled(stack, creds, env, tool["squeue"], "squeue_10k", figures)

    figures.update(slurm_figures())
    # The floor: all its samples, each taken just after a command's run; each command's
    # ratio divides by the floor taken beside its own runs.
    figures["floor_ms"] = statistics.median([t for samples in floors.values() for t in samples])
    print(f"Spur-Cloud CLI, whole processes, medians of {RUNS} runs (floor: python -c pass,")
    print("timed after each run of each command; 'x floor' divides by the floor beside it)")
    print(f"history: {history} jobs ({MANY} written in {fill_history_s:.0f} s)")
    print(f"queue: {queued} pending ({MANY} held jobs submitted in {fill_queue_s:.0f} s)")
    print(f"{'command':<34}{'ms':>10}{'x floor':>10}{'x slurm':>10}")
    rows = [
        ("python -c pass (floor)", "floor_ms", None),
        ("sbatch --wrap true", "sbatch_ms", "slurm_sbatch_ms"),
        (f"squeue ({MANY} queued)", "squeue_10k_ms", "slurm_squeue_ms"),
        ("squeue, each after a change", "squeue_10k_changed_ms", "slurm_squeue_ms"),
        (f"sacct ({MANY} finished)", "sacct_10k_ms", "slurm_sacct_ms"),
        ("sacct, each after a change", "sacct_10k_changed_ms", "slurm_sacct_ms"),
    ]
    for label, key, peer in rows:
        value = figures[key] or 0.0
        theirs = figures.get(peer) if peer else None
        ratio = f"{value / theirs:.1f}" if theirs else "-"
        floor = floor_of(key) if key in floors else value
        print(f"{label:<34}{value:>10.1f}{value / floor:>10.2f}{ratio:>10}")
    print(f"{f'{LOOP} x sbatch in a loop (jobs/s)':<34}{figures['sbatch_loop_jobs_per_s']:>10.1f}")
    out: dict[str, object] = {"bench": "cli"}
    for key in ("floor_ms", "sbatch_ms", "squeue_10k_ms", "sacct_10k_ms",
                "sbatch_loop_jobs_per_s", "slurm_sbatch_ms", "squeue_10k_changed_ms",
                "sacct_10k_changed_ms"):  # fmt: skip
        figure = figures.get(key)
        out[key] = None if figure is None else round(figure, 1)
    for key in floors:  # each command over the floor beside it
        out[f"{key}_x_floor"] = round((figures[key] or 0.0) / floor_of(key), 2)
    print(json.dumps(out))
    return 0


def slurm_figures() -> dict[str, float | None]:
    """The same commands against the Slurm peer, if it is up; None otherwise."""
    none: dict[str, float | None] = dict.fromkeys(
        ("slurm_sbatch_ms", "slurm_squeue_ms", "slurm_sacct_ms")
    )
    sbatch = shutil.which("sbatch", path="/usr/bin")
    if sbatch is None or not SLURM_CONF.exists():
        return none
    env = {**os.environ, "SLURM_CONF": str(SLURM_CONF)}
    try:
        return {
            "slurm_sbatch_ms": median_ms([sbatch, "--wrap", "true"], env),
            "slurm_squeue_ms": median_ms(["/usr/bin/squeue"], env),
            "slurm_sacct_ms": median_ms(["/usr/bin/sacct"], env),
        }
    except (OSError, RuntimeError):
        return none


if __name__ == "__main__":
    sys.exit(main())
