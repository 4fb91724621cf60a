"""`scontrol show job|node|partition|config` in Slurm 22.05's layout: `Key=value` pairs,
the first line flush left and the rest indented three spaces (golden files 02, 03, 28,
29), or all on one line with `-o`.

Each record is a list of lines of pairs; `render` joins them. The inputs are the web
API's objects (the job, node and partition dicts that squeue and sinfo read, and the
`/api/v1/config` pairs). What Spur does not know about a machine (its kernel, load,
free memory, boot time) is printed as Slurm prints an unknown value, never invented.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from scheduler.core.contract import JobState
from scheduler.slurm.hostlist import compress
from scheduler.slurm.memfmt import format_mem_mb
from scheduler.slurm.squeue_format import value_of
from scheduler.slurm.states import exit_code_text
from scheduler.slurm.timefmt import format_duration, format_timestamp, parse_iso, run_seconds

Obj = Mapping[str, Any]
Record = list[str]  # its lines, without indentation

INDENT = "   "
SLURM_RELEASE = "22.05.8"


def render(records: Sequence[Record], *, one_liner: bool = False) -> str:
    """The text scontrol prints for these records (each ends with a blank line, as
    Slurm's do; `-o` puts each on one line)."""
    out = []
    for record in records:
        if one_liner:
            out.append(" ".join(line for line in record if line) + "\n")
        else:
            out.append(
                "".join(("" if i == 0 else INDENT) + line + "\n" for i, line in enumerate(record))
                + "\n"
            )
    return "".join(out)


def _spec(job: Obj) -> Obj:
    spec = job.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _stamp(value: Any, missing: str = "Unknown") -> str:
    moment = parse_iso(value) if isinstance(value, str) else None
    return format_timestamp(moment) if moment is not None else missing


def _limit(minutes: Any) -> str:
    return "UNLIMITED" if minutes is None else format_duration(int(minutes) * 60)


def _mem(mb: int) -> str:
    return format_mem_mb(mb) if mb else "0"


def _per_node(job: Obj, key: str) -> list[int]:
    allocation = job.get("allocation")
    if not isinstance(allocation, Mapping):
        return []
    return [int(part.get(key) or 0) for part in allocation.values() if isinstance(part, Mapping)]


def _gpu_type(job: Obj) -> str:
    return str(_spec(job).get("gpu_type") or job.get("gpu_type") or "")


def _tres(job: Obj, *, allocated_type: str) -> str:
    cpus = int(job.get("num_cpus") or 0)
    nodes = int(job.get("num_nodes") or 0)
    parts = [f"cpu={cpus}"]
    mem = sum(_per_node(job, "mem_mb")) or int(_spec(job).get("mem_per_node_mb") or 0) * nodes
    if mem:
        parts.append(f"mem={format_mem_mb(mem)}")
    parts += [f"node={nodes}", f"billing={cpus}"]
    gpus = int(job.get("num_gpus") or 0)
    if gpus:
        parts.append(f"gres/gpu={gpus}")
        if allocated_type:
            parts.append(f"gres/gpu:{allocated_type}={gpus}")
    return ",".join(parts)


def _job_id_line(job: Obj) -> str:
    head = f"JobId={job['job_id']}"
    array_id = job.get("array_job_id")
    if array_id is not None:
        tasks = job.get("array_tasks") or job.get("array_task_id")  # a remainder: `5-9`
        head += f" ArrayJobId={array_id} ArrayTaskId={tasks}"
        throttle = int(job.get("array_throttle") or 0)
        if throttle:
            head += f" ArrayTaskThrottle={throttle}"
    return f"{head} JobName={job.get('name', '')}"


def _std(job: Obj, key: str, now: datetime) -> str:
    """The path with the job's own values in it, as squeue -O StdOut prints it."""
    return value_of(key, job, now.timestamp())  # a path column reads no time


def job_record(
    job: Obj, *, now: datetime, details: bool = False, node_models: Mapping[str, str] | None = None
) -> Record:
    """One job, as `scontrol show job [-d]` prints it. `node_models` names each node's GPU
    model (`gpu_models`), which a running job's TRES names as Slurm does."""
    spec = _spec(job)
    state = str(job.get("state", ""))
    running = bool(job.get("nodes")) and state != JobState.PENDING
    start = parse_iso(job.get("start_time"))
    end = parse_iso(job.get("end_time"))
    run_s = run_seconds(job, now)
    suspended = parse_iso(job.get("suspended_at"))
    limit = job.get("time_limit_min")
    # A pending job's StartTime is when it is expected to start (squeue --start), and
    # its EndTime that plus its limit (Unknown without one).
    shown_start = start if state != JobState.PENDING else parse_iso(job.get("expected_start"))
    if end is not None:
        end_text = format_timestamp(end)
    elif shown_start is not None and limit is not None:
        end_text = format_timestamp(shown_start + timedelta(minutes=int(limit)))
    else:
        end_text = "Unknown"
    nodes = [str(n) for n in job.get("nodes") or []]
    gpu_type = _gpu_type(job)
    if running and not gpu_type and node_models:
        models = {node_models.get(n, "") for n in nodes}
        gpu_type = models.pop() if len(models) == 1 else ""
    num_nodes = int(job.get("num_nodes") or 1)
    gpus_per_node = int(job.get("num_gpus") or 0) // max(num_nodes, 1)
    requeue = spec.get("requeue")
    ntasks = int(spec.get("ntasks") or num_nodes)
    cpus_per_task = int(spec.get("cpus_per_task") or 1)
    # A job killed after it started shows the signal (`0:15`), as its batch step does in
    # sacct; one cancelled while pending shows `0:0` (golden files 30, 31, 40).
    exit_text = exit_code_text(
        state, job.get("exit_code"), job.get("signal"), step=start is not None
    )
    restarts = max(int(job.get("attempt") or 0) - 1, 0)
    alloc_host = spec.get("submit_host") or "localhost"
    submit = _stamp(job.get("submit_time"))
    eligible = _stamp(job.get("eligible_time") or job.get("submit_time"))
    sched_eval = _stamp(job.get("start_time") or job.get("submit_time"))
    lines: Record = [
        _job_id_line(job),
        f"UserId={job.get('user', '')}({int(job.get('uid') or 0)}) "
        f"GroupId={job.get('user', '')}({int(job.get('gid') or 0)}) MCS_label=N/A",
        f"Priority={int(job.get('priority') or 0)} Nice={int(spec.get('nice') or 0)} "
        f"Account={job.get('account', '')} QOS={job.get('qos') or 'normal'}",
        f"JobState={state} Reason={job.get('reason') or 'None'} "
        f"Dependency={job.get('dependency') or '(null)'}",
        f"Requeue={0 if requeue is False else 1} Restarts={restarts} "
        f"BatchFlag=1 Reboot=0 ExitCode={exit_text}",
    ]
    if details:
        lines.append(f"DerivedExitCode={exit_text}")
    lines += [
        f"RunTime={format_duration(run_s)} TimeLimit={_limit(limit)} TimeMin=N/A",
        f"SubmitTime={submit} EligibleTime={eligible}",
        f"AccrueTime={eligible}",
        f"StartTime={_stamp_of(shown_start)} EndTime={end_text} Deadline=N/A",
        f"SuspendTime={_stamp(job.get('suspended_at')) if suspended else 'None'} "
        f"SecsPreSuspend={int(run_s) if suspended else 0} "
        f"LastSchedEval={sched_eval} Scheduler=Main",
        f"Partition={job.get('partition', '')} AllocNode:Sid={alloc_host}:0",
        f"ReqNodeList={','.join(spec.get('nodelist') or []) or '(null)'} "
        f"ExcNodeList={','.join(spec.get('exclude') or []) or '(null)'}",
        f"NodeList={compress(nodes)}" + _sched_node_list(job),
    ]
    if nodes:
        lines.append(f"BatchHost={nodes[0]}")
    lines += [
        f"NumNodes={num_nodes} NumCPUs={int(job.get('num_cpus') or 0)} NumTasks={ntasks} "
        f"CPUs/Task={cpus_per_task} ReqB:S:C:T=0:0:*:*",
        f"TRES={_tres(job, allocated_type=gpu_type if running else '')}",
        "Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=*",
    ]
    allocation = job.get("allocation")
    if details and nodes and isinstance(allocation, Mapping):
        gres = f"gpu:{gpu_type}:" if gpu_type else "gpu:"
        if gpus_per_node:
            lines.append(f"JOB_GRES={gres}{int(job.get('num_gpus') or 0)}")
        for name in nodes:
            part = allocation.get(name) or {}
            cpu_ids = [int(c) for c in part.get("cpu_ids") or []]
            cpu_text = _ranges(cpu_ids) if cpu_ids else "N/A"
            entry = f"  Nodes={name} CPU_IDs={cpu_text} Mem={int(part.get('mem_mb') or 0)}"
            gpus = [int(g) for g in part.get("gpus") or []]
            if gpus:
                entry += f" GRES={gres}{len(gpus)}(IDX:{_ranges(gpus)})"
            lines.append(entry)
    mem_node = spec.get("mem_per_node_mb")
    cpus_alloc = _per_node(job, "cpus")
    mems_alloc = _per_node(job, "mem_mb")
    if mem_node:
        mem_text = f"MinMemoryNode={_mem(int(mem_node))}"
    elif cpus_alloc and mems_alloc and sum(cpus_alloc):
        mem_text = f"MinMemoryCPU={_mem(sum(mems_alloc) // sum(cpus_alloc))}"
    else:
        mem_text = "MinMemoryNode=0"
    lines += [
        f"MinCPUsNode={cpus_per_task} {mem_text} MinTmpDiskNode=0",
        f"Features={spec.get('constraint') or '(null)'} DelayBoot=00:00:00",
        f"OverSubscribe={'NO' if spec.get('exclusive') else 'OK'} Contiguous=0 "
        "Licenses=(null) Network=(null)",
        "Command=(null)",
        f"WorkDir={job.get('workdir', '')}",
    ]
    comment = job.get("comment") or spec.get("comment")
    if comment:
        lines.append(f"Comment={comment} ")
    lines += [
        f"StdErr={_std(job, 'stderr', now)}",
        f"StdIn={_std(job, 'stdin', now)}",
        f"StdOut={_std(job, 'stdout', now)}",
        "Power=",
    ]
    if gpus_per_node:
        gres = f"gres:gpu:{_gpu_type(job)}:" if _gpu_type(job) else "gres:gpu:"
        lines.append(f"TresPerNode={gres}{gpus_per_node}")
    # Slurm ends a job's record with an empty indented line (MailUser's place).
    lines.append("")
    return lines


def _stamp_of(moment: datetime | None) -> str:
    return "Unknown" if moment is None else format_timestamp(moment)


def _sched_node_list(job: Obj) -> str:
    """` SchedNodeList=gpu[01-02]`: the nodes a pending job's reservation holds, on
    NodeList's line, as Slurm prints them (nothing when it has none)."""
    sched = [str(n) for n in job.get("sched_nodes") or []]
    if not sched or job.get("state") != JobState.PENDING:
        return ""
    return f" SchedNodeList={compress(sched)}"


def _ranges(values: Sequence[int]) -> str:
    """`0,1,2,5` -> `0-2,5` (Slurm's bitmap format)."""
    out: list[str] = []
    ordered = sorted(set(values))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


# -- nodes --------------------------------------------------------------------------------

NODE_STATES = {
    "idle": "IDLE",
    "mix": "MIXED",
    "alloc": "ALLOCATED",
    "down": "DOWN",
    "drain": "DRAINED",
}


def node_state_word(node: Obj) -> str:
    state = str(node.get("state", "")).lower()
    if state == "drain" and int(node.get("cpus_alloc") or 0):
        return "DRAINING"
    return NODE_STATES.get(state, state.upper())


def gpu_models(nodes: Sequence[Obj]) -> dict[str, str]:
    """Each node's GPU model, where all its GPUs are of one model."""
    out = {}
    for node in nodes:
        models = {str(g.get("model") or "") for g in node.get("gpus") or []}
        if len(models) == 1:
            out[str(node.get("name", ""))] = models.pop()
    return out


def _gpu_counts(node: Obj) -> dict[str, int]:
    counts: dict[str, int] = {}
    for gpu in node.get("gpus") or []:
        model = str(gpu.get("model") or "")
        counts[model] = counts.get(model, 0) + 1
    return counts


def _node_tres(cpus: int, mem_mb: int, gpus: int, counts: Mapping[str, int], *, cfg: bool) -> str:
    if not cfg and not (cpus or mem_mb or gpus):
        return ""
    parts = [f"cpu={cpus}"]
    if mem_mb or cfg:
        parts.append(f"mem={format_mem_mb(mem_mb)}")
    if cfg:
        parts.append(f"billing={cpus}")
    if gpus:
        parts.append(f"gres/gpu={gpus}")
        models = [m for m in counts if m]
        if len(models) == 1:
            parts.append(f"gres/gpu:{models[0]}={gpus}")
    return ",".join(parts)


def node_record(node: Obj) -> Record:
    """One node, as `scontrol show node` prints it."""
    name = str(node.get("name", ""))
    cpus = int(node.get("cpus") or 0)
    features = ",".join(str(f) for f in node.get("features") or []) or "(null)"
    counts = _gpu_counts(node)
    gres = ",".join(f"gpu:{m}:{c}" if m else f"gpu:{c}" for m, c in counts.items()) or "(null)"
    mem = int(node.get("memory_mb") or 0)
    alloc_cpus = int(node.get("cpus_alloc") or 0)
    alloc_mem = int(node.get("memory_alloc_mb") or 0)
    alloc_gpus = int(node.get("gpus_alloc") or 0)
    total_gpus = sum(counts.values())
    partitions = ",".join(str(p) for p in node.get("partitions") or [])
    lines: Record = [
        f"NodeName={name} Arch=(null) CoresPerSocket={int(node.get('cores_per_socket') or 1)} ",
        f"CPUAlloc={alloc_cpus} CPUEfctv={cpus} CPUTot={cpus} CPULoad=N/A",
        f"AvailableFeatures={features}",
        f"ActiveFeatures={features}",
        f"Gres={gres}",
        f"NodeAddr={name} NodeHostName={name} Version={SLURM_RELEASE}",
        "OS=(null) ",
        f"RealMemory={mem} AllocMem={alloc_mem} FreeMem=N/A "
        f"Sockets={int(node.get('sockets') or 1)} Boards=1",
        f"State={node_state_word(node)} ThreadsPerCore={int(node.get('threads_per_core') or 1)} "
        "TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A",
        f"Partitions={partitions} ",
        "BootTime=None SlurmdStartTime=None",
        "LastBusyTime=Unknown",
        f"CfgTRES={_node_tres(cpus, mem, total_gpus, counts, cfg=True)}",
        f"AllocTRES={_node_tres(alloc_cpus, alloc_mem, alloc_gpus, counts, cfg=False)}",
        "CapWatts=n/a",
        "CurrentWatts=0 AveWatts=0",
        "ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s",
    ]
    if node.get("reason"):
        lines.append(f"Reason={node['reason']}")
    return lines


# -- partitions ---------------------------------------------------------------------------


def partition_record(partition: Obj, nodes: Sequence[Obj]) -> Record:
    """One partition, as `scontrol show partition` prints it; `nodes` are the cluster's
    nodes (its totals are summed over those it holds)."""
    names = [str(n) for n in partition.get("nodes") or []]
    members = [n for n in nodes if n.get("name") in set(names)]
    cpus = sum(int(n.get("cpus") or 0) for n in members)
    mem = sum(int(n.get("memory_mb") or 0) for n in members)
    counts: dict[str, int] = {}
    for node in members:
        for model, count in _gpu_counts(node).items():
            counts[model] = counts.get(model, 0) + count
    gpus = sum(counts.values())
    tres = [f"cpu={cpus}", f"mem={format_mem_mb(mem)}", f"node={len(names)}", f"billing={cpus}"]
    if gpus:
        tres.append(f"gres/gpu={gpus}")
        models = [m for m in counts if m]
        if len(models) == 1:
            tres.append(f"gres/gpu:{models[0]}={gpus}")
    default_time = partition.get("default_time_min")
    return [
        f"PartitionName={partition.get('name', '')}",
        "AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL",
        f"AllocNodes=ALL Default={'YES' if partition.get('default') else 'NO'} QoS=N/A",
        f"DefaultTime={'NONE' if default_time is None else _limit(default_time)} "
        "DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO",
        f"MaxNodes=UNLIMITED MaxTime={_limit(partition.get('max_time_min'))} MinNodes=0 "
        "LLN=NO MaxCPUsPerNode=UNLIMITED",
        f"Nodes={compress(names) or '(null)'}",
        f"PriorityJobFactor=1 PriorityTier={int(partition.get('priority_tier') or 1)} "
        "RootOnly=NO ReqResv=NO OverSubscribe=NO",
        "OverTimeLimit=NONE PreemptMode=OFF",
        f"State={str(partition.get('state') or 'up').upper()} TotalCPUs={cpus} "
        f"TotalNodes={len(names)} SelectTypeParameters=NONE",
        "JobDefaults=(null)",
        "DefMemPerNode=UNLIMITED MaxMemPerNode=UNLIMITED",
        f"TRES={','.join(tres)}",
    ]


# -- configuration ------------------------------------------------------------------------


def config_lines(pairs: Mapping[str, Any], *, now: datetime) -> list[str]:
    """`scontrol show config`: a dated heading, then `%-23s = %s` in name order."""
    out = [f"Configuration data as of {format_timestamp(now)}"]
    for key in sorted(pairs, key=str.lower):
        out.append(f"{key:<23s} = {pairs[key]}")
    return out


# -- topology -----------------------------------------------------------------------------


def topology_lines(switches: Sequence[Obj]) -> list[str]:
    """`scontrol show topology`: one line per switch, every node under it, its children."""
    out = []
    for sw in switches:
        line = (
            f"SwitchName={sw.get('name', '')} Level={int(sw.get('level') or 0)} LinkSpeed=1 "
            f"Nodes={compress(sorted(str(n) for n in sw.get('nodes') or []))}"
        )
        children = [str(c) for c in sw.get("switches") or []]
        if children:
            line += f" Switches={compress(children)}"
        out.append(line)
    return out
