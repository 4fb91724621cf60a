from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agents.launcher import Launcher, LaunchRequest
from scheduler.client import JobReport


class RecordingReporter:
    """Stands in for the controller: keeps every report, in order."""

    def __init__(self) -> None:
        self.reports: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def report(self, report: JobReport) -> None:
        with self._lock:
            self.reports.append({"kind": report.kind, "job_id": report.job_id, **report.body()})

    def finished(self, job_id: int) -> dict[str, Any]:
        [report] = [r for r in self.reports if r["kind"] == "finished" and r["job_id"] == job_id]
        return report


def make_payload(
    job_id: int,
    script: str,
    *,
    workdir: str,
    node: str = "sim01",
    nodes: list[str] | None = None,
    gpus: list[int] | None = None,
    attempt: int = 1,
    stdout: str = "slurm-%j.out",
    stderr: str = "",
    **spec: Any,
) -> dict[str, Any]:
    nodes = nodes or [node]
    return {
        "job_id": job_id,
        "attempt": attempt,
        "node": node,
        "agent_url": "http://127.0.0.1:6818",
        "cluster_name": "testcluster",
        "job": {
            "job_id": job_id,
            "name": spec.get("name", "testjob"),
            "user": "alice",
            "account": "acme",
            "partition": "gpu",
            "qos": "normal",
            "nodes": nodes,
            "allocation": {n: {"gpus": gpus or [], "cpus": 2, "mem_mb": 1024} for n in nodes},
            "attempt": attempt,
            "submit_time": 1700000000.0 + job_id,
            "workdir": workdir,
            "stdout": stdout,
            "stderr": stderr,
            "spec": {
                "script": script,
                "workdir": workdir,
                "stdout": stdout,
                "stderr": stderr,
                **spec,
            },
        },
    }


@pytest.fixture
def reporter() -> RecordingReporter:
    return RecordingReporter()


@pytest.fixture
def launcher(tmp_path: Path, reporter: RecordingReporter) -> Iterator[Launcher]:
    launcher = Launcher(
        node="sim01", spool_dir=tmp_path / "spool", reporter=reporter, cluster_name="testcluster"
    )
    yield launcher
    launcher.kill_all(timeout=5)


@pytest.fixture
def payload() -> Callable[..., dict[str, Any]]:
    return make_payload


@pytest.fixture
def launch(launcher: Launcher) -> Callable[[dict[str, Any]], bool]:
    """Launch a payload as the API would (parse, then start); True for a duplicate."""

    def launch(payload: dict[str, Any]) -> bool:
        return launcher.launch(LaunchRequest.from_payload(payload))

    return launch
