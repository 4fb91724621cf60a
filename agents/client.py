"""The client of the agent API, used by the Celery workers (`spur.launch_jobs`,
`spur.signal_job`): `RpcClient` with the agent's calls typed.

Its errors are the RPC kit's, and the caller treats them apart: `Unavailable` (no
answer, a timeout, a 5xx) is worth retrying with backoff, since launch and signal are
idempotent; any other (a bad token, a malformed payload, the wrong node) will fail the
same way every time.
"""

from __future__ import annotations

from typing import Any

from scheduler.rpc.client import RpcClient


class AgentClient(RpcClient):
    """The client of one agent (`base_url`)."""

    def launch(self, payload: dict[str, Any]) -> dict[str, Any]:
        """`{"accepted": true, "duplicate": bool}`; a duplicate is success, not an error."""
        answer: dict[str, Any] = self.call(
            "POST", f"/v1/jobs/{int(payload['job_id'])}/launch", json=payload
        )
        return answer

    def launch_all(self, payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Several launches for this agent in one request, started in order. One result
        per launch, in order: `{"job_id", "attempt", "accepted": true, "duplicate"}`, or
        `{"job_id", "attempt", "error": {"detail", "code", "status"}}` for one the agent
        refused (or could not start now: status 503), which does not stop the others."""
        answer: dict[str, Any] = self.call("POST", "/v1/launches", json={"launches": payloads})
        results: list[dict[str, Any]] = answer["results"]
        return results

    def signal(
        self,
        job_id: int,
        *,
        attempt: int,
        signal: int,
        kill_after_s: float | None = None,
        signature: dict[str, Any] | None = None,
        step_id: int | None = None,
    ) -> dict[str, Any]:
        """`{"delivered": bool}`: false when the job does not run on that node (any more).
        `signature`: the controller's, as the task carries it (the agent refuses unsigned
        signals)."""
        body: dict[str, Any] = {"attempt": attempt, "signal": signal}
        if kill_after_s is not None:
            body["kill_after_s"] = kill_after_s
        if step_id is not None:
            body["step_id"] = step_id  # scancel N.S: that step's tasks only
        if signature is not None:
            body["signature"] = signature
        answer: dict[str, Any] = self.call("POST", f"/v1/jobs/{int(job_id)}/signal", json=body)
        return answer

    def output(
        self, job_id: int, *, stream: str = "stdout", offset: int = 0, limit: int = 65536
    ) -> dict[str, Any]:
        """A piece of a job's output as this node's agent answers it (agents/output.py):
        `{"job_id", "attempt", "stream", "offset", "next_offset", "size", "data",
        "running"}`; `NotFound` when that agent never launched the job."""
        params = {"stream": stream, "offset": str(int(offset)), "limit": str(int(limit))}
        answer: dict[str, Any] = self.call("GET", f"/v1/jobs/{int(job_id)}/output", params=params)
        return answer

    def ssh_activity(self, job_id: int) -> dict[str, Any]:
        """`{"job_id", "sessions", "active_at"}`: the job's SSH sessions on this node and
        when they last relayed a byte (epoch seconds, or null)."""
        answer: dict[str, Any] = self.call("GET", f"/v1/jobs/{int(job_id)}/ssh")
        return answer

    def jobs(self) -> list[dict[str, Any]]:
        jobs: list[dict[str, Any]] = self.call("GET", "/v1/jobs")["jobs"]
        return jobs

    def health(self) -> dict[str, Any]:
        answer: dict[str, Any] = self.call("GET", "/v1/health")
        return answer
