"""`spurcloud up`: the whole platform on one machine, in the foreground.

It is what `make up` runs, and what the end-to-end tests and `bench/e2e.py` start: one
controller replica, one Celery worker and Celery beat (billing's and the sessions'
periodic tasks), simulated-GPU agents and the web server, each a real process of its own
console script. The demo organisation is exempt from billing; the demo price book
(`seed_prices`) prices every other one's GPUs, CPUs and memory.

Everything that differs between this embedded platform and production is a setting
passed in the environment (DATABASE_URL, CELERY_BROKER_URL, CHANNEL_LAYER_URL): SQLite, a
file-system broker and the in-memory channel layer unless the caller's environment says
otherwise.

Jobs run as they do in production: each in a bubblewrap sandbox, in its organisation's
workspace under `<state dir>/work/` (or `--work-root`). Run as root (CI, a test machine),
the agents use cloud tenancy and create an account `spur-<organisation>` on this machine
for the demo organisation's jobs; run as a normal user, they run every job sandboxed as
that user (`personal = true` is written for them). Without bubblewrap it refuses to start.

Ctrl-C (or SIGTERM) stops every process it started; if one of them dies, it stops the
rest and exits non-zero rather than limp on.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from agents import ssh_transfer
from agents.identity import Identities
from agents.slurm_cli import install_for_host
from agents.workspace import Workspaces

BIN = Path(sys.executable).parent
DEFAULT_NODES = "sim01=mi300x-8,sim02=h100-8"


@dataclass
class Stack:
    state_dir: Path
    host: str = "127.0.0.1"
    web_port: int = 8000
    ctld_port: int = 6817
    raft_port: int = 6821
    agent_base_port: int = 6850
    ssh_base_port: int = 2222  # each agent's SSH into its jobs (agents/ssh.py); 0: none
    nodes: list[tuple[str, str]] = field(default_factory=list)
    work_root: Path | None = None  # the organisations' workspaces; default <state_dir>/work
    worker_concurrency: int = 8
    node_timeout_s: float = 30.0
    kill_jobs_on_exit: bool = True
    quiet: bool = False
    # Controller replicas (a Raft group) beyond the first: (HTTP port, Raft port) each.
    more_controllers: list[tuple[int, int]] = field(default_factory=list)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def web_url(self) -> str:
        return f"http://{self.host}:{self.web_port}"

    @property
    def ctld_url(self) -> str:
        return f"http://{self.host}:{self.ctld_port}"

    @property
    def controllers(self) -> list[tuple[int, int]]:
        """(HTTP port, Raft port) of each controller replica."""
        return [(self.ctld_port, self.raft_port), *self.more_controllers]

    @property
    def ctld_urls(self) -> list[str]:
        return [f"http://{self.host}:{http}" for http, _ in self.controllers]

    @property
    def workspaces(self) -> Path:
        return self.work_root or self.state_dir / "work"

    def say(self, message: str) -> None:
        if not self.quiet:
            print(message, flush=True)

    # -- set-up -----------------------------------------------------------------------

    def prepare(self) -> None:
        check_sandbox(self.workspaces)
        # Others may pass through (the jobs' accounts reach the default work root in it)
        # but not list it; what it holds is this user's alone.
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o711)
        (self.state_dir / "logs").mkdir(exist_ok=True)
        token = _secret(self.state_dir / "cluster-token")
        env = dict(os.environ)
        env.setdefault("DJANGO_SETTINGS_MODULE", "spurcloud.settings")
        env.setdefault("DATABASE_URL", f"sqlite:///{(self.state_dir / 'spurcloud.sqlite3')}")
        env.setdefault("CELERY_BROKER_URL", "filesystem://")
        env.setdefault("CELERY_BROKER_FOLDER", str(self.state_dir / "broker"))
        env.setdefault("SECRET_KEY", _secret(self.state_dir / "secret-key"))
        # The embedded platform runs as production does, only on other storage: DEBUG
        # off (it also costs a sixth of the submission rate in query bookkeeping).
        env.setdefault("DEBUG", "false")
        # It serves plain HTTP on this machine: Secure cookies would never come back, and
        # sign-in would fail its CSRF check. Production sits behind TLS and keeps them.
        env.setdefault("SECURE_COOKIES", "false")
        env["SPUR_CLUSTER_TOKEN"] = token
        env["SPUR_CONTROLLER_URLS"] = ",".join(self.ctld_urls)
        if self.more_controllers:  # a group: the replicas share these (spur.toml says so)
            env["SPUR_RAFT_PASSWORD"] = _secret(self.state_dir / "raft-password")
            env["SPUR_SIGNING_KEY"] = _secret(self.state_dir / "signing-key")
        env.setdefault("SPUR_CLUSTER_NAME", "spur")
        env["SPUR_WORK_ROOT"] = str(self.workspaces)
        env.setdefault("ALLOWED_HOSTS", f"127.0.0.1,localhost,{self.host}")
        self.env = env
        self._write_config(token)

    def _write_config(self, token: str) -> None:
        broker = self.env["CELERY_BROKER_URL"]
        # A normal user's agents cannot give jobs other identities: they run them as
        # this user, sandboxed, and say so (agents/identity.py).
        personal = "" if os.geteuid() == 0 else "personal = true\n"
        agents = "\n".join(
            f"# {name}: spurd --devices sim:{profile} --listen {self.host}:{port}"
            for (name, profile), port in zip(self.nodes, self._agent_ports(), strict=True)
        )
        (self.state_dir / "spur.toml").write_text(
            f"""# Written by `spurcloud up`; the cluster token is in cluster-token.
[cluster]
name = "{self.env["SPUR_CLUSTER_NAME"]}"
token_file = "{self.state_dir / "cluster-token"}"

[controller]
listen = "{self.host}:{self.ctld_port}"
raft_address = "{self.host}:{self.raft_port}"
state_dir = "{self.state_dir / "ctld"}"
broker_url = "{broker}"
broker_folder = "{self.env["CELERY_BROKER_FOLDER"]}"
node_timeout_s = {self.node_timeout_s}
kill_wait_s = 5
{self._raft_http()}
[[partitions]]
name = "gpu"
default = true

[agent]
controllers = {json.dumps(self.ctld_urls)}
work_root = "{self.workspaces}"
{personal}{agents}
"""
        )

    def _raft_http(self) -> str:
        """A group's replicas: which HTTP URL each Raft address answers at (leader hints)."""
        if not self.more_controllers:
            return ""
        pairs = ", ".join(
            f'"{self.host}:{raft}" = "http://{self.host}:{http}"' for http, raft in self.controllers
        )
        return f"raft_http = {{ {pairs} }}\n"

    def _agent_ports(self) -> list[int]:
        return [self.agent_base_port + i for i in range(len(self.nodes))]

    def ssh_line(self) -> str:
        """What `up` says of SSH into sessions, when the agents offer it, and of copying
        files over it (sftp, scp): what to install when this machine cannot serve it."""
        ports = self._ssh_ports()
        if not ports:
            return ""
        listed = ", ".join(f"{n} {p}" for (n, _), p in zip(self.nodes, ports, strict=True))
        line = f"  ssh:       into sessions, with a key from your account page ({listed})\n"
        if ssh_transfer.sftp_server() is None:
            return line + f"             WARNING: {ssh_transfer.MISSING_SFTP}\n"
        return line + "             sftp, scp and rsync -e ssh copy files in and out\n"

    def _ssh_ports(self) -> list[int]:
        if not self.ssh_base_port:
            return []
        return [self.ssh_base_port + i for i in range(len(self.nodes))]

    def manage(self, *args: str) -> str:
        result = subprocess.run(
            [str(BIN / "spurcloud"), "manage", *args],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"manage {' '.join(args)} failed:\n{result.stderr}{result.stdout}")
        return result.stdout

    # -- processes ----------------------------------------------------------------------

    def start(self, name: str, argv: list[str]) -> None:
        log = open(self.state_dir / "logs" / f"{name}.log", "ab")  # noqa: SIM115
        self.procs[name] = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,  # Ctrl-C reaches us only; we stop children in order
        )

    def start_all(self) -> None:
        config = str(self.state_dir / "spur.toml")
        if not self.more_controllers:
            self.start("spurctld", [str(BIN / "spurctld"), "--config", config])
        raft = [f"{self.host}:{port}" for _, port in self.controllers]
        for i, (http, _) in enumerate(self.controllers if self.more_controllers else []):
            peers = ",".join(address for j, address in enumerate(raft) if j != i)
            argv = [str(BIN / "spurctld"), "--config", config, "--listen", f"{self.host}:{http}",
                    "--raft-address", raft[i], "--raft-peers", peers,
                    "--state-dir", str(self.state_dir / f"ctld{i}")]  # fmt: skip
            self.start(f"spurctld{i}" if i else "spurctld", argv)
        for name, argv in self.celery_processes().items():
            self.start(name, argv)
        ssh_ports = self._ssh_ports() or [0] * len(self.nodes)
        for (name, profile), port, ssh_port in zip(
            self.nodes, self._agent_ports(), ssh_ports, strict=True
        ):
            argv = [
                str(BIN / "spurd"),
                "--config",
                config,
                "--name",
                name,
                "--listen",
                f"{self.host}:{port}",
                "--devices",
                f"sim:{profile}",
                "--spool-dir",
                str(self.state_dir / "agents" / name),
            ]
            if ssh_port:
                argv += ["--ssh-listen", f"{self.host}:{ssh_port}"]
            if self.kill_jobs_on_exit:
                argv.append("--kill-jobs-on-exit")
            self.start(f"spurd-{name}", argv)
        self.start(
            "web",
            [str(BIN / "spurcloud"), "web", "--host", self.host, "--port", str(self.web_port)],
        )

    def celery_processes(self) -> dict[str, list[str]]:
        """The worker, and beat: the periodic tasks (settings.CELERY_BEAT_SCHEDULE:
        per-minute metering, the grace period's stop, invoices, reconciliation, Stripe
        meter events, spend alerts, idle sessions) run only if beat sends them."""
        celery = [str(BIN / "celery"), "-A", "spurcloud"]
        return {
            "worker": [
                *celery,
                "worker",
                "--pool",
                "threads",
                "--concurrency",
                str(self.worker_concurrency),
                "--loglevel",
                "INFO",
                "--without-gossip",
                "--without-mingle",
            ],
            "beat": [
                *celery,
                "beat",
                "--loglevel",
                "INFO",
                "--schedule",
                str(self.state_dir / "celerybeat-schedule"),
            ],
        }

    def wait_ready(self, timeout: float = 60.0) -> None:
        headers = {"Authorization": f"Bearer {self.env['SPUR_CLUSTER_TOKEN']}"}
        deadline = time.monotonic() + timeout
        want = {name for name, _ in self.nodes}
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                nodes = httpx.get(f"{self.ctld_url}/v1/nodes", headers=headers, timeout=2)
                web = httpx.get(f"{self.web_url}/healthz", timeout=2)
                up = {n["name"] for n in nodes.json()["nodes"] if n["state"] != "down"}
                if web.status_code == 200 and want <= up:
                    return
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(0.1)
        raise RuntimeError(f"the platform did not come up in {timeout:.0f}s; see {self.logs}")

    @property
    def logs(self) -> Path:
        return self.state_dir / "logs"

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{name} exited with status {proc.returncode}; its log: {self.logs}/{name}.log"
                )

    def stop_all(self) -> None:
        for name in reversed(list(self.procs)):
            proc = self.procs[name]
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
        deadline = time.monotonic() + 10
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs.clear()

    # -- the demo -------------------------------------------------------------------------

    def seed(self) -> dict[str, str]:
        self.manage("seed_prices")  # a demo price book, into an empty one only
        out = self.manage("seed_demo")
        creds: dict[str, str] = json.loads(out.strip().splitlines()[-1])
        job_user, workspace = demo_workspace(self.workspaces, creds["organization"])
        # The Slurm commands first on PATH, as every account can run them (the job user
        # cannot run this virtual environment's interpreter); then this one's, for `spur`.
        tools = install_for_host(self.workspaces / ".tools")
        venv_bin = Path(sys.executable).parent
        _write_private(
            self.state_dir / "demo.env",
            f"export SPUR_API_URL={self.web_url}\nexport SPUR_TOKEN={creds['token']}\n"
            f"export SPUR_WORKSPACE={workspace}\nexport SPUR_JOB_USER={job_user}\n"
            f'export PATH="{tools}:{venv_bin}:$PATH"\n',
        )
        return creds


def demo_workspace(work_root: Path, organization: str) -> tuple[str, Path]:
    """The Unix account the organisation's jobs run as and its workspace, made now as
    the agents would at its first job: tools that drive Slurm run from the workspace as
    that account (`runuser -u "$SPUR_JOB_USER" --`), as they would on a cluster."""
    identity = Identities(personal=os.geteuid() != 0).for_job(tenant=organization, user="")
    workspaces = Workspaces(work_root)
    workspaces.prepare()
    return identity.name, workspaces.ensure(organization, identity)


def check_sandbox(work_root: Path) -> None:
    """Refuse, saying what to do, when jobs could not run: no bubblewrap, or (as root,
    where jobs get other identities) a work root they cannot reach."""
    if shutil.which("bwrap") is None:
        raise RuntimeError(
            "bubblewrap (bwrap) is not installed, and every job runs in its sandbox: "
            "install it (apt-get install bubblewrap, dnf install bubblewrap)"
        )
    if os.geteuid() == 0:
        blocked = Workspaces(work_root).unreachable()
        if blocked is not None:
            raise RuntimeError(
                f"jobs run as their organisations' accounts and cannot reach {work_root}: "
                f"{blocked} does not let others pass; give --work-root elsewhere"
            )


def _write_private(path: Path, text: str) -> None:
    """`text` into `path`, readable by its owner only (it holds the demo admin's token,
    and the state directory lets every account pass): made 0600 before it holds it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an older file keeps its mode through O_CREAT
    with os.fdopen(fd, "w") as out:
        out.write(text)


def _secret(path: Path) -> str:
    if path.exists():
        return path.read_text().strip()
    value = secrets.token_urlsafe(32)
    # Made 0600 from the start: a file chmod-ed after writing is readable in between.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(value + "\n")
    return value


def parse_nodes(text: str) -> list[tuple[str, str]]:
    nodes = []
    for item in text.split(","):
        name, sep, profile = item.partition("=")
        if not sep or not name or not profile:
            raise argparse.ArgumentTypeError(f"--nodes: expected NAME=PROFILE, got {item!r}")
        nodes.append((name.strip(), profile.strip()))
    return nodes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="spurcloud up", description="Run the whole platform on this machine."
    )
    parser.add_argument("--state-dir", default=".spur", type=Path)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="web port")
    parser.add_argument("--ctld-port", type=int, default=6817)
    parser.add_argument("--raft-port", type=int, default=6821)
    parser.add_argument("--agent-base-port", type=int, default=6850)
    parser.add_argument(
        "--ssh-base-port",
        type=int,
        default=2222,
        help="the agents' SSH into sessions, one port each from this one (0: off)",
    )
    parser.add_argument(
        "--nodes",
        type=parse_nodes,
        default=parse_nodes(DEFAULT_NODES),
        help=f"simulated nodes, NAME=PROFILE,... (default {DEFAULT_NODES})",
    )
    parser.add_argument(
        "--work-root", type=Path, help="the organisations' workspaces (default STATE_DIR/work)"
    )
    parser.add_argument("--worker-concurrency", type=int, default=8)
    parser.add_argument(
        "--node-timeout", type=float, default=30.0, help="seconds without a heartbeat"
    )
    args = parser.parse_args(argv)

    stack = Stack(
        state_dir=args.state_dir.resolve(),
        host=args.host,
        web_port=args.port,
        ctld_port=args.ctld_port,
        raft_port=args.raft_port,
        agent_base_port=args.agent_base_port,
        ssh_base_port=args.ssh_base_port,
        nodes=args.nodes,
        work_root=args.work_root.resolve() if args.work_root else None,
        worker_concurrency=args.worker_concurrency,
        node_timeout_s=args.node_timeout,
    )
    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        stack.prepare()
        stack.say("spurcloud: migrating the database ...")
        stack.manage("migrate", "--noinput")
        creds = stack.seed()
        stack.say("spurcloud: starting controller, worker, beat, agents and web ...")
        stack.start_all()
        stack.wait_ready()
        stack.say(
            f"""
Spur-Cloud is up.
  portal:    {stack.web_url}/   (admin: {creds["email"]} / {creds["password"]})
  API docs:  {stack.web_url}/api/docs/
  nodes:     {", ".join(f"{n} ({p})" for n, p in stack.nodes)}
{stack.ssh_line()}  logs:      {stack.logs}/

From another shell:
  . {stack.state_dir / "demo.env"} && sbatch --gres=gpu:2 --wrap 'nvidia-smi || env'
  squeue; sinfo; sacct
Jobs run sandboxed in the organisation's workspace, $SPUR_WORKSPACE: in the directory
sbatch ran in when that lies inside it, else in $SPUR_WORKSPACE/jobs/<job id>/.

Ctrl-C stops everything."""
        )
        while not stopping:
            stack.check_alive()
            time.sleep(0.5)
        return 0
    except RuntimeError as exc:
        print(f"spurcloud up: {exc}", file=sys.stderr)
        return 1
    finally:
        stack.say("spurcloud: stopping ...")
        stack.stop_all()
