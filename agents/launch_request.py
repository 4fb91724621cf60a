"""A launch as the controller sends it (docs/architecture.md, "Launch payload"), checked.

A payload that can never run as sent is `InvalidLaunch` (the API answers 400, and the
worker does not retry it); a job this node could not start is `LaunchError` (it ends
with exit code 1 and the reason).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.core.contract import JobSpec
from scheduler.core.errors import InvalidSpec


class InvalidLaunch(ValueError):
    """A launch payload that can never be run as sent (the API answers 400)."""


class LaunchError(Exception):
    """The job could not be started on this node; it ends with exit code 1."""


class StaleLaunch(Exception):
    """A launch made before the node was last declared lost: its job was ended then (the
    API answers 409, which the worker does not retry)."""


@dataclass(frozen=True)
class LaunchRequest:
    job_id: int
    attempt: int
    node: str
    cluster_name: str
    job: Mapping[str, Any]
    spec: JobSpec
    cmd_id: str = ""  # the controller command that caused the launch (for the logs)
    epoch: int = 0  # the node's epoch when the controller made the launch

    @property
    def key(self) -> tuple[int, int]:
        return (self.job_id, self.attempt)

    @property
    def first_node(self) -> str:
        return str(self.job["nodes"][0])

    @classmethod
    def from_payload(cls, payload: Any) -> LaunchRequest:
        if not isinstance(payload, dict):
            raise InvalidLaunch("the launch payload must be a JSON object")
        job_id = _int(payload, "job_id")
        attempt = _int(payload, "attempt")
        node = payload.get("node")
        if not isinstance(node, str) or not node:
            raise InvalidLaunch("node must be a non-empty string")
        cluster_name = payload.get("cluster_name", "")
        if not isinstance(cluster_name, str):
            raise InvalidLaunch("cluster_name must be a string")
        job = payload.get("job")
        if not isinstance(job, dict):
            raise InvalidLaunch("job must be an object")
        if job.get("job_id", job_id) != job_id:
            raise InvalidLaunch("job.job_id does not match job_id")
        nodes = job.get("nodes")
        if not isinstance(nodes, list) or not nodes or not all(isinstance(n, str) for n in nodes):
            raise InvalidLaunch("job.nodes must be a non-empty list of node names")
        if node not in nodes:
            raise InvalidLaunch(f"node {node} is not one of the job's nodes")
        if "spec" not in job:
            raise InvalidLaunch("job.spec is missing")
        try:
            spec = JobSpec.from_dict(job["spec"])
        except InvalidSpec as exc:
            raise InvalidLaunch(f"job.spec: {exc}") from exc
        cmd_id = payload.get("cmd_id", "")
        if not isinstance(cmd_id, str) or len(cmd_id) > 200:
            raise InvalidLaunch("cmd_id must be a string of at most 200 characters")
        epoch = _int(payload, "epoch") if "epoch" in payload else 0
        return cls(job_id, attempt, node, cluster_name, job, spec, cmd_id, epoch)


def _int(payload: Mapping[str, Any], key: str) -> int:
    value = payload.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidLaunch(f"{key} must be a non-negative integer")
    return value
