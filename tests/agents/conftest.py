from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agents.identity import Identities, Identity
from agents.launcher import Launcher, LaunchRequest
from scheduler.client import JobReport

TENANT = "acme"
OTHER_TENANT = "globex"
AS_ROOT = os.geteuid() == 0
root_only = pytest.mark.skipif(not AS_ROOT, reason="switching identity needs root")


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
    workdir: str = "",
    submit_dir: str = "",
    node: str = "sim01",
    nodes: list[str] | None = None,
    gpus: list[int] | None = None,
    attempt: int = 1,
    stdout: str = "slurm-%j.out",
    stderr: str = "",
    tenant: str = TENANT,
    user: str = "alice",
    mem_mb: int = 1024,
    cpu_ids: list[int] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    nodes = nodes or [node]
    allocation: dict[str, Any] = {"gpus": gpus or [], "cpus": 2, "mem_mb": mem_mb}
    if cpu_ids:
        allocation["cpu_ids"] = cpu_ids
    return {
        "job_id": job_id,
        "attempt": attempt,
        "node": node,
        "agent_url": "http://127.0.0.1:6818",
        "cluster_name": "testcluster",
        "job": {
            "job_id": job_id,
            "name": spec.get("name", "testjob"),
            "user": user,
            "tenant": tenant,
            "account": tenant,
            "partition": "gpu",
            "qos": "normal",
            "nodes": nodes,
            "allocation": {n: dict(allocation) for n in nodes},
            "attempt": attempt,
            "submit_time": 1700000000.0 + job_id,
            "workdir": workdir or submit_dir,
            "stdout": stdout,
            "stderr": stderr,
            "spec": {
                "script": script,
                "workdir": workdir,
                "submit_dir": submit_dir,
                "stdout": stdout,
                "stderr": stderr,
                "tenant": tenant,
                "user": user,
                **spec,
            },
        },
    }


@pytest.fixture(scope="session")
def reachable_tmp() -> Iterator[Path]:
    """A directory every user may pass through (pytest's own are 0700 and root's, and a
    job's identity must reach its workspace to have it mounted)."""
    path = Path(tempfile.mkdtemp(prefix="spur-tests-", dir="/tmp"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def work_root(reachable_tmp: Path) -> Path:
    parent = Path(tempfile.mkdtemp(dir=reachable_tmp))
    parent.chmod(0o711)
    return parent / "work"


@pytest.fixture(scope="session")
def identities() -> Identities:
    """Cloud tenancy as root (accounts spur-acme, spur-globex are made once and kept);
    as anyone else, personal mode."""
    return Identities() if AS_ROOT else Identities(personal=True)


@pytest.fixture
def reporter() -> RecordingReporter:
    return RecordingReporter()


@pytest.fixture
def make_launcher(
    tmp_path: Path, reporter: RecordingReporter, work_root: Path, identities: Identities
) -> Iterator[Callable[..., Launcher]]:
    """A launcher like the `launcher` fixture's, with other arguments (a sandbox, a CDI
    spec, limits); its jobs are killed at the end."""
    made: list[Launcher] = []

    def make(**kw: Any) -> Launcher:
        launcher = Launcher(
            node="sim01",
            spool_dir=tmp_path / "spool",
            reporter=reporter,
            work_root=work_root,
            identities=identities,
            **kw,
        )
        made.append(launcher)
        return launcher

    yield make
    for launcher in made:
        launcher.kill_all(timeout=5)
        launcher.close()


@pytest.fixture
def launcher(
    tmp_path: Path, reporter: RecordingReporter, work_root: Path, identities: Identities
) -> Iterator[Launcher]:
    launcher = Launcher(
        node="sim01",
        spool_dir=tmp_path / "spool",
        reporter=reporter,
        cluster_name="testcluster",
        work_root=work_root,
        identities=identities,
    )
    yield launcher
    launcher.kill_all(timeout=5)
    launcher.close()


@pytest.fixture
def identity(identities: Identities) -> Identity:
    return identities.for_job(tenant=TENANT, user="alice")


@pytest.fixture
def workspace(launcher: Launcher, identity: Identity) -> Path:
    """The organisation's workspace on the node, made as the agent makes it."""
    return launcher.workspaces.ensure(TENANT, identity)


@pytest.fixture
def put(identity: Identity) -> Callable[[Path, str], Path]:
    """Write a file (or, with text None, a directory) as the organisation's identity."""

    def put(path: Path, text: str | None = "") -> Path:
        if text is None:
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.write_text(text)
        os.chown(path, identity.uid, identity.gid)
        return path

    return put


@pytest.fixture
def payload() -> Callable[..., dict[str, Any]]:
    return make_payload


@pytest.fixture
def launch(launcher: Launcher) -> Callable[[dict[str, Any]], bool]:
    """Launch a payload as the API would (parse, then start); True for a duplicate."""

    def launch(payload: dict[str, Any]) -> bool:
        return launcher.launch(LaunchRequest.from_payload(payload))

    return launch
