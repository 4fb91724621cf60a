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

from scheduler.core.commands import PartitionDef
from scheduler.core.errors import Rejected
from scheduler.core.policy import DEFAULT_QOS, Account, Policy, QoS, check_policy


class ConfigError(ValueError):
    pass


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
    _only(
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
    cluster = _table(data, "cluster")
    _only(cluster, "cluster", {"name", "token", "token_file"})
    token = env.get("SPUR_CLUSTER_TOKEN") or _str(cluster, "cluster", "token", "")
    token_file = env.get("SPUR_CLUSTER_TOKEN_FILE") or _str(cluster, "cluster", "token_file", "")
    if not token and token_file:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"cluster.token_file: {exc}") from exc
    if not token:
        raise ConfigError("cluster.token is required (or SPUR_CLUSTER_TOKEN)")

    ctl = _table(data, "controller")
    _only(ctl, "controller", set(ControllerConfig.__dataclass_fields__))
    defaults = ControllerConfig()
    node_timeout = _num(ctl, "controller", "node_timeout_s", defaults.node_timeout_s)
    controller = ControllerConfig(
        listen=_str(ctl, "controller", "listen", defaults.listen),
        raft_address=_str(ctl, "controller", "raft_address", defaults.raft_address),
        raft_peers=tuple(_strs(ctl, "controller", "raft_peers", [])),
        raft_http=tuple(sorted(_str_map(ctl, "controller", "raft_http").items())),
        raft_password=env.get("SPUR_RAFT_PASSWORD") or _str(ctl, "controller", "raft_password", ""),
        signing_key=env.get("SPUR_SIGNING_KEY") or _key_file(ctl),
        signing_key_file=_str(ctl, "controller", "signing_key_file", ""),
        state_dir=_str(ctl, "controller", "state_dir", defaults.state_dir),
        broker_url=env.get("CELERY_BROKER_URL")
        or _str(ctl, "controller", "broker_url", defaults.broker_url),
        broker_folder=env.get("CELERY_BROKER_FOLDER")
        or _str(ctl, "controller", "broker_folder", defaults.broker_folder),
        node_timeout_s=node_timeout,
        lease_s=_num(ctl, "controller", "lease_s", node_timeout / 2),
        fence_margin_s=_num(ctl, "controller", "fence_margin_s", node_timeout / 6),
        kill_wait_s=_num(ctl, "controller", "kill_wait_s", defaults.kill_wait_s),
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
        _only(
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
                name=_str(part, where, "name", ""),
                nodes=_str(part, where, "nodes", "ALL"),
                default=_bool(part, where, "default", False),
                max_time_min=max_time,
                default_time_min=default_time,
                priority_tier=_int(part, where, "priority_tier", 1),
                preempt_mode=_choice(
                    part, where, "preempt_mode", ("", "off", "requeue", "cancel"), ""
                ),
                allow_accounts=tuple(_strs(part, where, "allow_accounts", [])),
            )
        )
    names = [p.name for p in partitions]
    if "" in names or len(set(names)) != len(names):
        raise ConfigError("every partition needs a unique name")
    if sum(p.default for p in partitions) > 1:
        raise ConfigError("at most one partition may be the default")

    ag = _table(data, "agent")
    _only(ag, "agent", set(AgentConfig.__dataclass_fields__))
    adef = AgentConfig()
    agent = AgentConfig(
        name=_str(ag, "agent", "name", adef.name),
        listen=_str(ag, "agent", "listen", adef.listen),
        url=_str(ag, "agent", "url", adef.url),
        controllers=tuple(_strs(ag, "agent", "controllers", list(adef.controllers))),
        devices=_str(ag, "agent", "devices", adef.devices),
        spool_dir=_str(ag, "agent", "spool_dir", adef.spool_dir),
        heartbeat_interval_s=_num(ag, "agent", "heartbeat_interval_s", adef.heartbeat_interval_s),
        work_root=_str(ag, "agent", "work_root", adef.work_root),
        tenancy=_choice(ag, "agent", "tenancy", ("cloud", "site"), adef.tenancy),
        uid_range=_uid_range(ag),
        site_users=tuple(sorted(_str_map(ag, "agent", "site_users").items())),
        personal=_bool(ag, "agent", "personal", adef.personal),
        pids_max=_positive_int(ag, "agent", "pids_max", adef.pids_max),
        sandbox_hide=tuple(_strs(ag, "agent", "sandbox_hide", [])),
        sandbox_binds=tuple(_strs(ag, "agent", "sandbox_binds", [])),
        ssh_listen=_host_port(ag, "ssh_listen"),
        ssh_address=_host_port(ag, "ssh_address"),
        step_grace_s=_num(ag, "agent", "step_grace_s", adef.step_grace_s),
    )
    if agent.ssh_address and not agent.ssh_listen:
        raise ConfigError("agent.ssh_address is set but agent.ssh_listen is not")
    return SpurConfig(
        cluster_name=_str(cluster, "cluster", "name", "spur"),
        token=token,
        controller=controller,
        partitions=tuple(partitions),
        agent=agent,
        policy=_policy(data),
    )


def _host_port(table: dict[str, Any], key: str) -> str:
    """A "HOST:PORT" setting of the agent ("" when not given)."""
    value = _str(table, "agent", key, "")
    if not value:
        return value
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"agent.{key} must be HOST:PORT (a port 1-65535), not {value!r}")
    return value


def _policy(data: dict[str, Any]) -> Policy:
    sched = _table(data, "scheduler")
    _only(
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
    half_life_min = _minutes(sched, "scheduler", "fairshare_half_life")
    qos = [_qos(q, f"qos[{i}]") for i, q in enumerate(_tables(data, "qos"))] or list(DEFAULT_QOS)
    accounts = [_account(a, f"accounts[{i}]") for i, a in enumerate(_tables(data, "accounts"))]
    if len({q.name for q in qos}) != len(qos) or len({a.name for a in accounts}) != len(accounts):
        raise ConfigError("every qos and every account needs a unique name")
    policy = Policy.of(
        qos,
        accounts,
        default_qos=_str(sched, "scheduler", "default_qos", defaults.default_qos),
        shards_per_gpu=_int(sched, "scheduler", "shards_per_gpu", defaults.shards_per_gpu),
        fairshare_half_life_s=(
            defaults.fairshare_half_life_s if half_life_min is None else half_life_min * 60.0
        ),
        backfill_depth=_int(sched, "scheduler", "backfill_depth", defaults.backfill_depth),
        topology=_table(data, "topology"),
        account_defaults=Account(
            name="",
            max_submit_jobs=_int(
                sched,
                "scheduler",
                "max_submit_jobs_per_account",
                defaults.account_defaults.max_submit_jobs or 0,
            )
            or None,
            grp_gpus=_opt_int(sched, "scheduler", "max_gpus_per_account"),
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
    _only(q, where, keys)
    name = _str(q, where, "name", "")
    if not name:
        raise ConfigError(f"{where}.name is required")
    return QoS(
        name=name,
        priority=_int(q, where, "priority", 0),
        preempt=tuple(_strs(q, where, "preempt", [])),
        preempt_mode=_choice(q, where, "preempt_mode", ("requeue", "cancel"), "requeue"),
        grace_s=float(_int(q, where, "grace_s", 30)),
        max_gpus_per_user=_opt_int(q, where, "max_gpus_per_user"),
        max_gpus_per_account=_opt_int(q, where, "max_gpus_per_account"),
        max_jobs_per_user=_opt_int(q, where, "max_jobs_per_user"),
    )


def _account(a: dict[str, Any], where: str) -> Account:
    _only(a, where, {"name", "shares", "grp_gpus", "parent", "max_submit_jobs"})
    name = _str(a, where, "name", "")
    if not name:
        raise ConfigError(f"{where}.name is required")
    return Account(
        name=name,
        shares=_int(a, where, "shares", 1),
        grp_gpus=_opt_int(a, where, "grp_gpus"),
        parent=_str(a, where, "parent", ""),
        max_submit_jobs=_opt_int(a, where, "max_submit_jobs") or None,
    )


def _positive_int(data: dict[str, Any], where: str, key: str, default: int) -> int:
    value = _int(data, where, key, default)
    if value < 1:
        raise ConfigError(f"{where}.{key} must be a positive integer")
    return value


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


def _tables(data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ConfigError(f"{key} must be an array of tables ([[{key}]])")
    return value


def _int(data: dict[str, Any], where: str, key: str, default: int) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{where}.{key} must be a non-negative integer")
    return value


def _opt_int(data: dict[str, Any], where: str, key: str) -> int | None:
    return None if data.get(key) is None else _int(data, where, key, 0)


def _choice(
    data: dict[str, Any], where: str, key: str, allowed: tuple[str, ...], default: str
) -> str:
    value = _str(data, where, key, default)
    if value not in allowed:
        shown = ", ".join(repr(a) for a in allowed)
        raise ConfigError(f"{where}.{key} must be one of: {shown}")
    return value


def _table(data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{key} must be a table")
    return value


def _only(data: dict[str, Any], where: str, allowed: set[str]) -> None:
    unknown = set(data) - allowed
    if unknown:
        prefix = f"{where}." if where else ""
        raise ConfigError(f"unknown setting(s): {', '.join(prefix + k for k in sorted(unknown))}")


def _key_file(ctl: dict[str, Any]) -> str:
    if "signing_key" in ctl:
        raise ConfigError("controller.signing_key: give signing_key_file, not the key itself")
    path = _str(ctl, "controller", "signing_key_file", "")
    if not path:
        return ""
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"controller.signing_key_file: {exc}") from exc


def _str(data: dict[str, Any], where: str, key: str, default: str) -> str:
    value = data.get(key, default)
    if not isinstance(value, str):
        raise ConfigError(f"{where}.{key} must be a string")
    return value


def _strs(data: dict[str, Any], where: str, key: str, default: list[str]) -> list[str]:
    value = data.get(key, default)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}.{key} must be an array of strings")
    return value


def _str_map(data: dict[str, Any], where: str, key: str) -> dict[str, str]:
    value = data.get(key, {})
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ConfigError(f"{where}.{key} must be a table of strings")
    return value


def _num(data: dict[str, Any], where: str, key: str, default: float) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(f"{where}.{key} must be a positive number")
    return float(value)


def _bool(data: dict[str, Any], where: str, key: str, default: bool) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}.{key} must be true or false")
    return value


def _time_limits(part: dict[str, Any], where: str) -> tuple[int, int]:
    """A partition's (maximum, default) time limit in minutes. Every partition has both,
    so that nothing runs unbounded (and a job's cost estimate, price x GPUs x time
    limit, has a bound): left out, the maximum is DEFAULT_MAX_TIME_MIN and the default
    DEFAULT_TIME_MIN (never above the maximum). "UNLIMITED" is refused."""
    max_time = _minutes(part, where, "max_time") if "max_time" in part else DEFAULT_MAX_TIME_MIN
    if not max_time:
        raise ConfigError(
            f"{where}.max_time: a partition needs a maximum time limit (nothing runs "
            f"unbounded); leave it out for {DEFAULT_MAX_TIME_MIN} minutes"
        )
    if "default_time" not in part:
        return max_time, min(DEFAULT_TIME_MIN, max_time)
    default_time = _minutes(part, where, "default_time")
    if not default_time or default_time > max_time:
        raise ConfigError(
            f"{where}.default_time must be a time limit no longer than max_time ({max_time} "
            "minutes)"
        )
    return max_time, default_time


def _minutes(data: dict[str, Any], where: str, key: str) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        from scheduler.slurm.timefmt import parse_time_minutes

        try:
            return parse_time_minutes(value)
        except ValueError as exc:
            raise ConfigError(f"{where}.{key}: {exc}") from exc
    raise ConfigError(f"{where}.{key} must be minutes or a Slurm time string")
