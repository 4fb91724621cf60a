"""A real `spurd` process for tests, and `Courier`: what the Celery worker does with the
controller's launches (the tests of liveness, reports and fencing start a real
controller and real agents, and no web app: the courier reads the controller's file
broker and posts each signed launch to its agent, as `spur.launch_jobs` does)."""

from __future__ import annotations

import base64
import json
import os
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from agents import jobrecord
from agents.client import AgentClient
from scheduler.ctld.dispatch import LAUNCH_TASK
from scheduler.rpc.errors import error_for
from tests.fixtures.processes import BIN, Processes, free_port, wait_until


def reachable_dir() -> Path:
    """A directory every user may pass through (a job's identity must reach its
    workspace to have it mounted; pytest's own directories are private)."""
    path = Path(tempfile.mkdtemp(prefix="spur-tests-", dir="/tmp"))
    path.chmod(0o711)
    return path


@dataclass
class RunningAgent:
    name: str
    url: str
    token: str
    config_path: Path
    spool: Path
    work_root: Path
    procs: Processes
    args: tuple[str, ...] = ()  # more of spurd's options

    def start(self, *, registered: bool = True) -> None:
        command = [str(BIN / "spurd"), "--config", str(self.config_path), *self.args]
        self.procs.start(self.name, command)
        wait_until(self.healthy, timeout=30, what=f"agent {self.name}")
        if registered:
            wait_until((self.spool / "credential").exists, timeout=30, what="registration")

    def healthy(self) -> bool:
        answer = httpx.get(
            f"{self.url}/v1/health", headers={"Authorization": f"Bearer {self.token}"}, timeout=2
        )
        return answer.status_code == 200

    @property
    def pid(self) -> int:
        return self.procs.procs[self.name].pid

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.procs.stop(self.name, sig)

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def job_init(self, job_id: int, attempt: int = 1) -> int:
        """The pid of the job's sandbox init (its record's `run`), once it was started."""
        jobdir = self.spool / "jobs" / f"{job_id}.{attempt}"
        wait_until(lambda: jobrecord.read(jobdir).run is not None, timeout=30,
                   what=f"job {job_id} to run")  # fmt: skip
        run = jobrecord.read(jobdir).run
        assert run is not None
        return int(run["processes"].split()[0])

    def client(self) -> AgentClient:
        return AgentClient(self.url, self.token, timeout=10)


def start_agent(
    tmp: Path,
    procs: Processes,
    *,
    name: str,
    token: str,
    controllers: list[str],
    work_root: Path,
    devices: str = "sim:h100-8",
    args: tuple[str, ...] = (),
) -> RunningAgent:
    port = free_port()
    spool = tmp / f"spool-{name}"
    config = tmp / f"spurd-{name}.toml"
    urls = ", ".join(f'"{u}"' for u in controllers)
    config.write_text(
        f"""
[cluster]
name = "testcluster"
token = "{token}"

[agent]
name = "{name}"
listen = "127.0.0.1:{port}"
controllers = [{urls}]
devices = "{devices}"
spool_dir = "{spool}"
work_root = "{work_root}"
"""
    )
    agent = RunningAgent(
        name, f"http://127.0.0.1:{port}", token, config, spool, work_root, procs, args
    )
    agent.start()
    return agent


@dataclass
class Courier:
    """Carries the launches the controller sent to its file broker to their agents."""

    broker: Path
    token: str
    delivered: list[dict[str, Any]] = field(default_factory=list)

    def deliver(self, job_id: int, *, timeout: float = 30.0) -> dict[str, Any]:
        """Deliver launches until job `job_id`'s; its payload."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for batch in self._launches():
                with AgentClient(batch[0]["agent_url"], self.token, timeout=10) as agent:
                    results = agent.launch_all(batch)
                self.delivered += batch
                for result in results:  # a test that needs a refusal reads the agent
                    if "error" in result:
                        error = result["error"]
                        raise error_for(error["status"], error["detail"], error["code"])
            for payload in self.delivered:
                if payload["job_id"] == job_id:
                    return payload
            time.sleep(0.05)
        raise TimeoutError(f"no launch of job {job_id} in {self.broker}")

    def _launches(self) -> list[list[dict[str, Any]]]:
        """Each launch task's payloads (one node's launches)."""
        found = []
        for path in sorted(self.broker.glob("*.msg")):
            try:
                message = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # being written (they are renamed into place, but be safe)
            path.unlink()
            if message.get("headers", {}).get("task") != LAUNCH_TASK:
                continue
            body = message["body"]
            if message.get("properties", {}).get("body_encoding") == "base64":
                body = base64.b64decode(body).decode()
            args, _kwargs, _embed = json.loads(body)
            found.append(args[0])
        return found
