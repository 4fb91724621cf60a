"""`spurd`: the node agent.

    spurd --config spur.toml [--name N] [--listen HOST:PORT] [--url URL]
          [--devices sim:mi300x-8|sim:h100-8|auto|none] [--controllers URL,...]
          [--spool-dir DIR] [--ssh-listen HOST:PORT] [--kill-jobs-on-exit]

Flags override the `[agent]` table of spur.toml; the cluster token comes from the
`[cluster]` table or SPUR_CLUSTER_TOKEN(_FILE). On start it checks that it can contain
jobs (agents/confinement.py: bubblewrap, an identity for each job, a reachable work
root) and refuses to start if not; then it discovers the node, writes the CDI spec,
serves the agent API (and, with `ssh_listen`, SSH into its jobs: agents/ssh.py),
registers with the controller and heartbeats.

On SIGTERM/SIGINT it stops serving and leaves its jobs running: an agent restarted for
an upgrade must not take its tenants' jobs down with it (they are found again through
the spool). `--kill-jobs-on-exit` kills them instead, for the embedded single-host
platform where Ctrl-C means "stop everything".
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agents.api import create_app
from agents.cdi import write_cdi_spec
from agents.confinement import confine
from agents.credentials import NodeCredential
from agents.devices import discover_node
from agents.launcher import Launcher
from agents.node import NodeMembership
from agents.reports import ReportQueue
from agents.ssh import SshService, SshUnavailable, advertised_address
from agents.step_run import StepRun
from agents.supervisor import Lease
from scheduler.client import ControllerClient
from scheduler.config import AgentConfig, ConfigError, load
from scheduler.core.contract import ssh as ssh_contract
from scheduler.rpc import serving
from scheduler.rpc.errors import RpcError

log = logging.getLogger("spurd")


@dataclass(frozen=True)
class Settings:
    cluster_name: str
    token: str
    agent: AgentConfig
    kill_jobs_on_exit: bool = False
    config_path: str = ""

    @property
    def host_port(self) -> tuple[str, int]:
        return parse_listen(self.agent.listen)


def parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ConfigError(f"listen must be HOST:PORT, not {listen!r}")
    return host.strip("[]"), int(port)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spurd", description="Spur node agent")
    parser.add_argument("--config", help="spur.toml (default: built-in defaults)")
    parser.add_argument("--name", help="node name (default: [agent] name, else the host name)")
    parser.add_argument("--listen", help="HOST:PORT to serve the agent API on")
    parser.add_argument("--url", help="URL the controller and workers reach this agent at")
    parser.add_argument("--devices", help="sim:mi300x-8, sim:h100-8, auto or none")
    parser.add_argument("--controllers", help="controller URLs, comma-separated")
    parser.add_argument("--spool-dir", help="where job scripts, outputs and CDI specs go")
    parser.add_argument("--ssh-listen", help="HOST:PORT to serve SSH into running jobs on")
    parser.add_argument(
        "--kill-jobs-on-exit", action="store_true", help="kill running jobs when stopping"
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    return parser


def resolve_settings(args: argparse.Namespace, env: dict[str, str]) -> Settings:
    config = load(args.config, env=env)
    agent = config.agent
    changes: dict[str, object] = {}
    for flag in ("name", "listen", "url", "devices", "spool_dir", "ssh_listen"):
        value = getattr(args, flag)
        if value:
            changes[flag] = value
    if args.controllers:
        changes["controllers"] = tuple(u.strip() for u in args.controllers.split(",") if u.strip())
    agent = dataclasses.replace(agent, **changes)  # type: ignore[arg-type]
    if not agent.name:
        agent = dataclasses.replace(agent, name=socket.gethostname().split(".")[0])
    if not agent.spool_dir:
        agent = dataclasses.replace(agent, spool_dir=f".spur/agents/{agent.name}")
    if not agent.work_root:
        agent = dataclasses.replace(agent, work_root=".spur/work")
    host, port = parse_listen(agent.listen)
    if agent.ssh_listen:
        parse_listen(agent.ssh_listen)
    if not agent.url and host in ("0.0.0.0", "::", ""):
        # Listening everywhere says nothing about how others reach us.
        agent = dataclasses.replace(agent, url=f"http://{socket.getfqdn()}:{port}")
    if not config.token:
        raise ConfigError("no cluster token: set [cluster] token or SPUR_CLUSTER_TOKEN")
    if not agent.controllers:
        raise ConfigError("no controller URL: set [agent] controllers or --controllers")
    return Settings(
        cluster_name=config.cluster_name,
        token=config.token,
        agent=agent,
        kill_jobs_on_exit=args.kill_jobs_on_exit,
        config_path=args.config or "",
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s spurd %(levelname)s %(name)s: %(message)s",
    )
    # One line per heartbeat and report drowns what matters.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # asyncssh says a dozen lines of every SSH connection; agents/ssh.py says what matters.
    logging.getLogger("asyncssh").setLevel(logging.WARNING)
    try:
        settings = resolve_settings(args, dict(os.environ))
        return serve(settings)
    except (ConfigError, ValueError, SshUnavailable) as exc:
        print(f"spurd: error: {exc}", file=sys.stderr)
        return 2


def serve(settings: Settings) -> int:
    agent = settings.agent
    # Before anything else: an agent that cannot contain jobs must not take any.
    confinement = confine(agent, config_path=settings.config_path, spool_dir=agent.spool_dir)
    node = discover_node(name=agent.name, agent_url=agent.advertised_url, devices=agent.devices)
    spool = Path(agent.spool_dir)
    spool.mkdir(parents=True, exist_ok=True)
    cdi_path = write_cdi_spec(spool, node.gpus)
    log.info(
        "node %s: %d CPUs, %d MB, %d GPUs (%s)%s",
        node.name,
        node.cpus,
        node.memory_mb,
        len(node.gpus),
        agent.devices,
        f"; CDI spec {cdi_path}" if cdi_path else "",
    )
    # Not the default 10 s: a report or registration waiting on a paused replica must
    # move on to the leader well within the node timeout (heartbeats use less still).
    controller = ControllerClient(list(agent.controllers), settings.token, timeout=5.0)
    # Durable: what an earlier run of this agent could not deliver is sent first.
    reports = ReportQueue(controller, outbox=spool / "outbox").start()
    lease = Lease()
    # The key the controller signs this node's launches with (agents/credentials.py).
    credential = NodeCredential(spool / "credential", node.name)
    launcher = Launcher(
        node=node.name,
        spool_dir=spool,
        reporter=reports,
        cluster_name=settings.cluster_name,
        gpu_vendor=node.gpus[0].vendor if node.gpus else "",
        work_root=confinement.work_root,
        identities=confinement.identities,
        sandbox=confinement.sandbox,
        limits=confinement.limits,
        cdi_spec=cdi_path,
        pids_max=confinement.pids_max,
        lease=lease,
        credential=credential,
        controllers=agent.controllers,
        step_grace_s=agent.step_grace_s,
    )
    # A step whose srun is gone for good is killed by the agent (agents/steps.py): the
    # controller hears how it ended, as from srun.
    launcher.steps.on_orphan = functools.partial(_orphaned_step, controller)
    adopted = launcher.recover()
    if adopted:
        log.info("adopted %d job(s) left running by an earlier spurd", len(adopted))
    ssh = None
    if agent.ssh_listen:
        # Before registering: the node's description says where SSH is and its host key.
        ssh = SshService(launcher, listen=agent.ssh_listen, host_key_dir=spool)
        ssh.start()
        node = dataclasses.replace(node, labels=ssh_labels(node.labels, agent, ssh))
    membership = NodeMembership(
        node=node,
        controller=controller,
        jobs=launcher,
        credential=credential,
        heartbeat_interval_s=agent.heartbeat_interval_s,
        lease=lease,
        on_contact=functools.partial(_contact, launcher, reports),
        ending=reports.unacknowledged_ends,
    )
    host, port = settings.host_port
    # uvloop and httptools, no access log, each answer written once (scheduler/rpc/serving.py).
    server = serving.server(
        create_app(launcher=launcher, token=settings.token, credential=credential, ssh=ssh),
        host,
        port,
    )
    stop = threading.Event()
    failed: list[str] = []

    def membership_loop() -> None:
        # Register only once the API answers: the controller may launch at once.
        while not server.started and not stop.wait(0.05):
            pass
        try:
            membership.run(stop)
        except RpcError as exc:
            failed.append(str(exc))
            log.critical("the controller refused this node: %s", exc)
            server.should_exit = True

    # uvicorn re-raises the SIGTERM/SIGINT it caught once it has stopped, to the handler
    # that was there before it: without ours that kills spurd before the clean-up below.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda received, frame: log.info("signal %d: stopping", received))
    thread = threading.Thread(target=membership_loop, name="spurd-membership", daemon=True)
    thread.start()
    log.info("serving the agent API on %s (%s)", agent.listen, agent.advertised_url)
    # What start-up made (modules, classes, the app) lives as long as the agent: kept out
    # of the cyclic collector's passes. Launches allocate enough to set off a full pass
    # every hundred jobs or so, and each walked all of it again (25 ms on a busy node).
    gc.freeze()
    try:
        server.run()  # returns on SIGTERM/SIGINT (uvicorn's handlers)
    finally:
        stop.set()
        thread.join(5)
        if ssh is not None:
            ssh.stop()
        running = launcher.running()
        if settings.kill_jobs_on_exit:
            log.info("killing %d running job(s)", len(running))
            launcher.kill_all()
        elif running:
            log.info(
                "leaving %d job(s) running: %s",
                len(running),
                ", ".join(f"{j['job_id']}.{j['attempt']} (pid {j['pid']})" for j in running),
            )
        launcher.steps.stop()  # what still runs is the next agent's to adopt
        if not reports.flush(timeout=5):
            log.warning("%d report(s) not delivered before exit", reports.pending())
        reports.stop()
        controller.close()
    return 1 if failed or not server.started else 0


def ssh_labels(
    labels: tuple[tuple[str, str], ...], agent: AgentConfig, ssh: SshService
) -> tuple[tuple[str, str], ...]:
    """The node's labels with where clients reach its SSH and the host key they will see."""
    listen = f"{parse_listen(agent.ssh_listen)[0]}:{ssh.port}"
    address = advertised_address(listen, agent.ssh_address, agent.advertised_url)
    found = dict(labels)
    found[ssh_contract.ADDRESS_LABEL] = address
    found[ssh_contract.HOST_KEY_LABEL] = ssh.host_key_line
    return tuple(sorted(found.items()))


def _orphaned_step(
    controller: ControllerClient, run: StepRun, exit_code: int, signum: int, cancelled: bool
) -> None:
    """Tell the controller how a step nobody streamed ended: cancelled (it was killed for
    it, as Slurm cancels a step whose srun died) or as its tasks ended."""
    try:
        if cancelled:
            controller.cancel_step(run.job_id, run.step_id, tenant=run.tenant,
                                   signal=int(signal.SIGKILL), attempt=run.attempt)  # fmt: skip
        else:
            controller.end_step(run.job_id, run.step_id, tenant=run.tenant, exit_code=exit_code,
                                signal=signum, attempt=run.attempt)  # fmt: skip
    except RpcError as exc:
        log.warning("the end of step %s (attempt %s) was not recorded: %s", run.label,
                    run.attempt, exc.message)  # fmt: skip


def _contact(launcher: Launcher, reports: ReportQueue) -> None:
    """The leader acknowledged a heartbeat: pass the renewed lease on to the jobs'
    supervisors, and send waiting reports now rather than after their backoff."""
    launcher.renew_lease()
    reports.wake()


if __name__ == "__main__":
    raise SystemExit(main())
