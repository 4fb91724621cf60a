"""The client of the agent API, used by the Celery workers (`spur.launch_job`,
`spur.signal_job`): `RpcClient` with the agent's calls typed.

Its errors are the RPC kit's, and the caller treats them apart: `Unavailable` (no
answer, a timeout, a 5xx) is worth retrying with backoff, since launch and signal are
idempotent; any other (a bad token, a malformed payload, the wrong node) will fail the
same way every time.
"""

from __future__ import annotations

from typing import Any

import httpx

from scheduler.rpc.client import RpcClient


class AgentClient:
    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.rpc = RpcClient([self.base_url], token, timeout=timeout, transport=transport)

    def close(self) -> None:
        self.rpc.close()

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def launch(self, payload: dict[str, Any]) -> dict[str, Any]:
        """`{"accepted": true, "duplicate": bool}`; a duplicate is success, not an error."""
        answer: dict[str, Any] = self.rpc.call(
            "POST", f"/v1/jobs/{int(payload['job_id'])}/launch", json=payload
        )
        return answer

    def signal(
        self, job_id: int, *, attempt: int, signal: int, kill_after_s: float | None = None
    ) -> dict[str, Any]:
        """`{"delivered": bool}`: false when the job does not run on that node (any more)."""
        body: dict[str, Any] = {"attempt": attempt, "signal": signal}
        if kill_after_s is not None:
            body["kill_after_s"] = kill_after_s
        answer: dict[str, Any] = self.rpc.call("POST", f"/v1/jobs/{int(job_id)}/signal", json=body)
        return answer

    def jobs(self) -> list[dict[str, Any]]:
        jobs: list[dict[str, Any]] = self.rpc.call("GET", "/v1/jobs")["jobs"]
        return jobs

    def health(self) -> dict[str, Any]:
        answer: dict[str, Any] = self.rpc.call("GET", "/v1/health")
        return answer
