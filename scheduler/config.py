"""`spur.toml`: the one configuration file of the controller and the agents.

```toml
[cluster]
name = "spur"
token = "..."                 # or token_file = "..."; env SPUR_CLUSTER_TOKEN wins

[controller]
listen = "127.0.0.1:6817"     # HTTP RPC
raft_address = "127.0.0.1:6821"
raft_peers = []               # the other replicas' raft addresses
raft_http = {}                # raft address -> HTTP URL of that replica (for leader hints)
raft_password = ""            # authenticates and encrypts Raft traffic between replicas
signing_key_file = ""         # the key launches are signed with (replicas only); env
                              # SPUR_SIGNING_KEY wins; a lone replica keeps one in state_dir
state_dir = ".spur/ctld"
broker_url = "filesystem://"  # Celery broker that effects are sent to; env CELERY_BROKER_URL wins
broker_folder = ".spur/broker"
node_timeout_s = 30           # a silent node is lost after this: its jobs end, GPUs freed
lease_s = 15                  # the fencing lease each acknowledged heartbeat grants (default
                              # node_timeout_s / 2): a cut-off node's jobs die when it ends
fence_margin_s = 5            # time a fenced job has to die (default node_timeout_s / 6);
                              # lease_s + fence_margin_s < node_timeout_s is enforced
kill_wait_s = 10
pass_min_interval_s = 0.03    # the least time between two scheduling passes' starts
                              # (Slurm's sched_min_interval); 0: a pass per change

[[partitions]]
name = "gpu"
nodes = "ALL"                 # or a hostlist, "sim[01-02]"
default = true
max_time = "7-00:00:00"       # the longest a job may run (default 7 days; never unlimited)
default_time = "1:00:00"      # a job without --time gets this (default 60 min)
priority_tier = 1             # higher tiers go first and may preempt lower ones
allow_accounts = []           # accounts that may use it (empty: all)
preempt_mode = ""             # "" (the QoS decides), "off", "requeue", "cancel"

[scheduler]
default_qos = "normal"
shards_per_gpu = 8            # --gres=shard:N cuts a GPU in this many shards
fairshare_half_life = "7-0"   # Slurm time (PriorityDecayHalfLife) or minutes
backfill_depth = 16           # reservations for the top blocked jobs
max_submit_jobs_per_account = 10000  # jobs an organisation may have waiting (0: no cap)
max_gpus_per_account = 64     # GPUs an organisation's running jobs may hold (default none)

[[qos]]                       # none given: "normal", "spot" (which normal preempts), "interactive"
name = "normal"
priority = 0
preempt = ["spot"]            # QoS whose jobs this one may preempt
preempt_mode = "requeue"      # what happens to jobs of *this* QoS: requeue or cancel
grace_s = 30                  # SIGTERM, then SIGKILL after this long
max_gpus_per_user = 64        # optional limits: max_gpus_per_account, max_jobs_per_user

[[accounts]]                  # a tenant's own account exists without being listed
name = "ml"
shares = 4
grp_gpus = 32                 # optional GrpTRES=gres/gpu
max_submit_jobs = 500         # optional MaxSubmitJobs (jobs waiting at once)
parent = ""

[topology]                    # passed through to placement as given

[agent]
name = "sim01"
listen = "127.0.0.1:6818"
url = "http://127.0.0.1:6818" # what the controller and workers call; default from listen
controllers = ["http://127.0.0.1:6817"]
devices = "sim:mi300x-8"      # or "auto": discover real GPUs
spool_dir = ".spur/agents/sim01"
work_root = ".spur/work"      # the organisations' workspaces: {work_root}/{tenant}/
tenancy = "cloud"             # "cloud": one account spur-<tenant> per organisation, made
                              # by the agent; "site": existing accounts (site_users)
uid_range = [200000, 299999]  # cloud accounts' uids and gids (keep clear of /etc/subuid)
personal = false              # a non-root agent runs every job as itself (else it refuses)
pids_max = 16384              # processes (tasks) of one job
sandbox_hide = []             # more host paths no job may see (config, token, spool are)
sandbox_binds = []            # host directories jobs see read-write (site: /home, /scratch)
step_grace_s = 30             # a step that no srun streams (it is gone) is killed after this

[agent.site_users]            # site tenancy: platform user -> Unix account
alice = "alice"
```

Every value is checked when loaded: an unknown key or a wrong type is a `ConfigError`
naming the key, never a silent default.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# What `load` and `parse` raise: importers catch it as `scheduler.config.ConfigError`.
from scheduler.config_values import ConfigError as ConfigError
from scheduler.config_values import (
    get_bool,
    get_choice,
    get_int,
    get_minutes,
    get_num,
    get_opt_int,
    get_positive_int,
    get_str,
    get_str_map,
    get_strs,
    get_table,
    get_tables,
    only,
)
from scheduler.core.commands import PartitionDef
from scheduler.core.errors import Rejected
from scheduler.core.policy import DEFAULT_QOS, Account, Policy, QoS, check_policy


@dataclass(frozen=True)
class ControllerConfig:
    listen: str = "127.0.0.1:6817"
    raft_address: str = "127.0.0.1:6821"
    raft_peers: tuple[str, ...] = ()
    raft_http: tuple[tuple[str, str], ...] = ()
    raft_password: str = ""
    signing_key: str = ""  # resolved: the key itself (never written back to a file)
    signing_key_file: str = ""
    state_dir: str = ".spur/ctld"
    broker_url: str = "filesystem://"
    broker_folder: str = ".spur/broker"
    node_timeout_s: float = 30.0
    # Fencing (docs/architecture.md, "Liveness, reports and fencing"): each heartbeat the
    # leader acknowledges renews the node's lease; a job whose lease runs out is killed by
    # its own supervisor; a node is lost (its GPUs freed) only after node_timeout_s, which
    # `check_fencing` holds above lease_s + fence_margin_s.
    lease_s: float = 15.0
    fence_margin_s: float = 5.0
    kill_wait_s: float = 10.0
    # A pass starts at once after a quiet spell, and at most this often under a stream of
    # changes: each then plans what came meanwhile (one allocation entry, one launch
    # message a node, the agents' reports together) rather than one pass and one of each
    # a job. bench/e2e.py: 0.03 s moved 13% more jobs a second than a pass per change,
    # the controller's and worker's CPU a job down a third, for 20 ms more to a job's
    # start; longer intervals gained nothing more.
    pass_min_interval_s: float = 0.03

    @property
    def heartbeat_interval_s(self) -> float:
        """How often agents heartbeat (the controller tells them at registration)."""
        return self.node_timeout_s / HEARTBEATS_PER_TIMEOUT

    @property
    def report_grace_s(self) -> float:
        """How long a job may be missing from its node's heartbeats without the agent's
        report of its end before it is ended NODE_FAIL (three heartbeats)."""
        return self.node_timeout_s / 2


HEARTBEATS_PER_TIMEOUT = 6
# A pass runs at least once a second (begin times, limits): a longer least interval
# would contradict it.
MAX_PASS_MIN_INTERVAL_S = 1.0


def check_fencing(ctl: ControllerConfig) -> None:
    """A lost node's GPUs are given to other jobs only once its own jobs are certainly
    dead: node_timeout_s > lease_s + fence_margin_s. And a lease spans two heartbeats at
    least, so that one late heartbeat does not fence a healthy node's jobs."""
    if not ctl.lease_s + ctl.fence_margin_s < ctl.node_timeout_s:
        raise ConfigError(
            f"controller.node_timeout_s ({ctl.node_timeout_s:g}) must be longer than "
            f"controller.lease_s + controller.fence_margin_s ({ctl.lease_s:g} + "
            f"{ctl.fence_margin_s:g}): a lost node's GPUs would be given away while its "
            "jobs may still run"
        )
    if ctl.lease_s < 2 * ctl.heartbeat_interval_s:
        raise ConfigError(
            f"controller.lease_s ({ctl.lease_s:g}) must span two heartbeats at least "
            f"(2 x node_timeout_s / {HEARTBEATS_PER_TIMEOUT} = "
            f"{2 * ctl.heartbeat_interval_s:g})"
        )


@dataclass(frozen=True)
class AgentConfig:
    name: str = ""
    listen: str = "127.0.0.1:6818"
    url: str = ""
    controllers: tuple[str, ...] = ("http://127.0.0.1:6817",)
    devices: str = "auto"
    spool_dir: str = ""
    heartbeat_interval_s: float = 5.0
    work_root: str = ""
    tenancy: str = "cloud"
    uid_range: tuple[int, int] = (200000, 299999)
    site_users: tuple[tuple[str, str], ...] = ()
    personal: bool = False
    pids_max: int = 16384
    sandbox_hide: tuple[str, ...] = ()
    sandbox_binds: tuple[str, ...] = ()
    ssh_listen: str = ""  # "HOST:PORT" of the agent's SSH server into jobs; "": none
    ssh_address: str = ""  # "HOST:PORT" clients dial; "": the agent URL's host, that port
    step_grace_s: float = 30.0  # a step no srun streams is killed after this long

    @property
    def advertised_url(self) -> str:
        return self.url or f"http://{self.listen}"


# The built-in partition's limits (a job's cost estimate is price x GPUs x time limit).
DEFAULT_TIME_MIN = 60
DEFAULT_MAX_TIME_MIN = 7 * 24 * 60


@dataclass(frozen=True)
class SpurConfig:
    cluster_name: str = "spur"
    token: str = ""
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    partitions: tuple[PartitionDef, ...] = (
        PartitionDef(
            name="gpu",
            default=True,
            max_time_min=DEFAULT_MAX_TIME_MIN,
            default_time_min=DEFAULT_TIME_MIN,
        ),
    )
    agent: AgentConfig = field(default_factory=AgentConfig)
    policy: Policy = field(default_factory=Policy)

    @property
    def default_partition(self) -> str:
        for p in self.partitions:
            if p.default:
                return p.name
        return self.partitions[0].name


def load(path: str | os.PathLike[str] | None, *, env: dict[str, str] | None = None) -> SpurConfig:
    env = dict(os.environ) if env is None else env
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError as exc:
            raise ConfigError(f"config file not found: {path}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: {exc}") from exc
    return parse(data, env=env)


def parse(data: dict[str, Any], *, env: dict[str, str] | None = None) -> SpurConfig:
    env = {} if env is None else env
    only(
        data,
        "",
        {
            "cluster",
            "controller",
            "partitions",
            "agent",
            "scheduler",
            "qos",
            "accounts",
            "topology",
        },
    )
    cluster = get_table(data, "cluster")
    only(cluster, "cluster", {"name", "token", "token_file"})
    token = env.get("SPUR_CLUSTER_TOKEN") or get_str(cluster, "cluster", "token", "")
    token_file = env.get("SPUR_CLUSTER_TOKEN_FILE") or get_str(cluster, "cluster", "token_file", "")
    if not token and token_file:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"cluster.token_file: {exc}") from exc
    if not token:
        raise ConfigError("cluster.token is required (or SPUR_CLUSTER_TOKEN)")

    ctl = get_table(data, "controller")
    only(ctl, "controller", set(ControllerConfig.__dataclass_fields__))
    defaults = ControllerConfig()
    node_timeout = get_num(ctl, "controller", "node_timeout_s", defaults.node_timeout_s)
    controller = ControllerConfig(
        listen=get_str(ctl, "controller", "listen", defaults.listen),
        raft_address=get_str(ctl, "controller", "raft_address", defaults.raft_address),
        raft_peers=tuple(get_strs(ctl, "controller", "raft_peers", [])),
        raft_http=tuple(sorted(get_str_map(ctl, "controller", "raft_http").items())),
        raft_password=env.get("SPUR_RAFT_PASSWORD")
        or get_str(ctl, "controller", "raft_password", ""),
        signing_key=env.get("SPUR_SIGNING_KEY") or _key_file(ctl),
        signing_key_file=get_str(ctl, "controller", "signing_key_file", ""),
        state_dir=get_str(ctl, "controller", "state_dir", defaults.state_dir),
        broker_url=env.get("CELERY_BROKER_URL")
        or get_str(ctl, "controller", "broker_url", defaults.broker_url),
        broker_folder=env.get("CELERY_BROKER_FOLDER")
        or get_str(ctl, "controller", "broker_folder", defaults.broker_folder),
        node_timeout_s=node_timeout,
        lease_s=get_num(ctl, "controller", "lease_s", node_timeout / 2),
        fence_margin_s=get_num(ctl, "controller", "fence_margin_s", node_timeout / 6),
        kill_wait_s=get_num(ctl, "controller", "kill_wait_s", defaults.kill_wait_s),
        pass_min_interval_s=get_num(
            ctl,
            "controller",
            "pass_min_interval_s",
            defaults.pass_min_interval_s,
            zero=True,
            most=MAX_PASS_MIN_INTERVAL_S,
        ),
    )
    check_fencing(controller)

    # Without [[partitions]]: one, the default, with limits, so that nothing runs unbounded.
    raw_parts = data.get(
        "partitions",
        [
            {
                "name": "gpu",
                "default": True,
                "max_time": DEFAULT_MAX_TIME_MIN,
                "default_time": DEFAULT_TIME_MIN,
            }
        ],
    )
    if not isinstance(raw_parts, list) or not raw_parts:
        raise ConfigError("partitions must be a non-empty array of tables")
    partitions = []
    for i, part in enumerate(raw_parts):
        where = f"partitions[{i}]"
        if not isinstance(part, dict):
            raise ConfigError(f"{where} must be a table")
        only(
            part,
            where,
            {
                "name",
                "nodes",
                "default",
                "max_time",
                "default_time",
                "priority_tier",
                "preempt_mode",
                "allow_accounts",
            },
        )
        max_time, default_time = _time_limits(part, where)
        partitions.append(
            PartitionDef(
                name=get_str(part, where, "name", ""),
                nodes=get_str(part, where, "nodes", "ALL"),
                default=get_bool(part, where, "default", False),
                max_time_min=max_time,
                default_time_min=default_time,
                priority_tier=get_int(part, where, "priority_tier", 1),
                preempt_mode=get_choice(
                    part, where, "preempt_mode", ("", "off", "requeue", "cancel"), ""
                ),
                allow_accounts=tuple(get_strs(part, where, "allow_accounts", [])),
            )
        )
    names = [p.name for p in partitions]
    if "" in names or len(set(names)) != len(names):
        raise ConfigError("every partition needs a unique name")
    if sum(p.default for p in partitions) > 1:
        raise ConfigError("at most one partition may be the default")

    ag = get_table(data, "agent")
    only(ag, "agent", set(AgentConfig.__dataclass_fields__))
    adef = AgentConfig()
    agent = AgentConfig(
        name=get_str(ag, "agent", "name", adef.name),
        listen=get_str(ag, "agent", "listen", adef.listen),
        url=get_str(ag, "agent", "url", adef.url),
        controllers=tuple(get_strs(ag, "agent", "controllers", list(adef.controllers))),
        devices=get_str(ag, "agent", "devices", adef.devices),
        spool_dir=get_str(ag, "agent", "spool_dir", adef.spool_dir),
        heartbeat_interval_s=get_num(
            ag, "agent", "heartbeat_interval_s", adef.heartbeat_interval_s
        ),
        work_root=get_str(ag, "agent", "work_root", adef.work_root),
        tenancy=get_choice(ag, "agent", "tenancy", ("cloud", "site"), adef.tenancy),
        uid_range=_uid_range(ag),
        site_users=tuple(sorted(get_str_map(ag, "agent", "site_users").items())),
        personal=get_bool(ag, "agent", "personal", adef.personal),
        pids_max=get_positive_int(ag, "agent", "pids_max", adef.pids_max),
        sandbox_hide=tuple(get_strs(ag, "agent", "sandbox_hide", [])),
        sandbox_binds=tuple(get_strs(ag, "agent", "sandbox_binds", [])),
        ssh_listen=_host_port(ag, "ssh_listen"),
        ssh_address=_host_port(ag, "ssh_address"),
        step_grace_s=get_num(ag, "agent", "step_grace_s", adef.step_grace_s),
    )
    if agent.ssh_address and not agent.ssh_listen:
        raise ConfigError("agent.ssh_address is set but agent.ssh_listen is not")
    return SpurConfig(
        cluster_name=get_str(cluster, "cluster", "name", "spur"),
        token=token,
        controller=controller,
        partitions=tuple(partitions),
        agent=agent,
        policy=_policy(data),
    )


def _host_port(table: dict[str, Any], key: str) -> str:
    """A "HOST:PORT" setting of the agent ("" when not given)."""
    value = get_str(table, "agent", key, "")
    if not value:
        return value
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"agent.{key} must be HOST:PORT (a port 1-65535), not {value!r}")
    return value


def _policy(data: dict[str, Any]) -> Policy:
    sched = get_table(data, "scheduler")
    only(
        sched,
        "scheduler",
        {
            "default_qos",
            "shards_per_gpu",
            "fairshare_half_life",
            "backfill_depth",
            "max_submit_jobs_per_account",
            "max_gpus_per_account",
        },
    )
    defaults = Policy()
    half_life_min = get_minutes(sched, "scheduler", "fairshare_half_life")
    qos = [_qos(q, f"qos[{i}]") for i, q in enumerate(get_tables(data, "qos"))] or list(DEFAULT_QOS)
    accounts = [_account(a, f"accounts[{i}]") for i, a in enumerate(get_tables(data, "accounts"))]
    if len({q.name for q in qos}) != len(qos) or len({a.name for a in accounts}) != len(accounts):
        raise ConfigError("every qos and every account needs a unique name")
    policy = Policy.of(
        qos,
        accounts,
        default_qos=get_str(sched, "scheduler", "default_qos", defaults.default_qos),
        shards_per_gpu=get_int(sched, "scheduler", "shards_per_gpu", defaults.shards_per_gpu),
        fairshare_half_life_s=(
            defaults.fairshare_half_life_s if half_life_min is None else half_life_min * 60.0
        ),
        backfill_depth=get_int(sched, "scheduler", "backfill_depth", defaults.backfill_depth),
        topology=get_table(data, "topology"),
        account_defaults=Account(
            name="",
            max_submit_jobs=get_int(
                sched,
                "scheduler",
                "max_submit_jobs_per_account",
                defaults.account_defaults.max_submit_jobs or 0,
            )
            or None,
            grp_gpus=get_opt_int(sched, "scheduler", "max_gpus_per_account"),
        ),
    )
    try:
        check_policy(policy)
    except Rejected as exc:
        raise ConfigError(exc.message) from exc
    return policy


def _qos(q: dict[str, Any], where: str) -> QoS:
    keys = {
        "name",
        "priority",
        "preempt",
        "preempt_mode",
        "grace_s",
        "max_gpus_per_user",
        "max_gpus_per_account",
        "max_jobs_per_user",
    }
    only(q, where, keys)
    name = get_str(q, where, "name", "")
    if not name:
        raise ConfigError(f"{where}.name is required")
    return QoS(
        name=name,
        priority=get_int(q, where, "priority", 0),
        preempt=tuple(get_strs(q, where, "preempt", [])),
        preempt_mode=get_choice(q, where, "preempt_mode", ("requeue", "cancel"), "requeue"),
        grace_s=float(get_int(q, where, "grace_s", 30)),
        max_gpus_per_user=get_opt_int(q, where, "max_gpus_per_user"),
        max_gpus_per_account=get_opt_int(q, where, "max_gpus_per_account"),
        max_jobs_per_user=get_opt_int(q, where, "max_jobs_per_user"),
    )


def _account(a: dict[str, Any], where: str) -> Account:
    only(a, where, {"name", "shares", "grp_gpus", "parent", "max_submit_jobs"})
    name = get_str(a, where, "name", "")
    if not name:
        raise ConfigError(f"{where}.name is required")
    return Account(
        name=name,
        shares=get_int(a, where, "shares", 1),
        grp_gpus=get_opt_int(a, where, "grp_gpus"),
        parent=get_str(a, where, "parent", ""),
        max_submit_jobs=get_opt_int(a, where, "max_submit_jobs") or None,
    )


def _uid_range(ag: dict[str, Any]) -> tuple[int, int]:
    value = ag.get("uid_range", list(AgentConfig.uid_range))
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        or not 0 < value[0] <= value[1]
    ):
        raise ConfigError("agent.uid_range must be [low, high], with 0 < low <= high")
    return value[0], value[1]


def _key_file(ctl: dict[str, Any]) -> str:
    if "signing_key" in ctl:
        raise ConfigError("controller.signing_key: give signing_key_file, not the key itself")
    path = get_str(ctl, "controller", "signing_key_file", "")
    if not path:
        return ""
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"controller.signing_key_file: {exc}") from exc


def _time_limits(part: dict[str, Any], where: str) -> tuple[int, int]:
    """A partition's (maximum, default) time limit in minutes. Every partition has both,
    so that nothing runs unbounded (and a job's cost estimate, price x GPUs x time
    limit, has a bound): left out, the maximum is DEFAULT_MAX_TIME_MIN and the default
    DEFAULT_TIME_MIN (never above the maximum). "UNLIMITED" is refused."""
    max_time = get_minutes(part, where, "max_time") if "max_time" in part else DEFAULT_MAX_TIME_MIN
    if not max_time:
        raise ConfigError(
            f"{where}.max_time: a partition needs a maximum time limit (nothing runs "
            f"unbounded); leave it out for {DEFAULT_MAX_TIME_MIN} minutes"
        )
    if "default_time" not in part:
        return max_time, min(DEFAULT_TIME_MIN, max_time)
    default_time = get_minutes(part, where, "default_time")
    if not default_time or default_time > max_time:
        raise ConfigError(
            f"{where}.default_time must be a time limit no longer than max_time ({max_time} "
            "minutes)"
        )
    return max_time, default_time
