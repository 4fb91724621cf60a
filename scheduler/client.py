"""The HTTP client for the controller API (see docs/architecture.md, "Controller API").

Used by the web app (submit, cancel, live queue, nodes) and by agents (register,
heartbeat, reports). It knows every controller replica and moves on to the next one when
a replica cannot be reached; any replica accepts writes (Raft forwards them to the
leader).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import httpx


class ControllerError(Exception):
    """The controller answered, but not with success."""

    def __init__(self, message: str, *, status: int = 0, code: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code


class ControllerUnavailable(ControllerError):
    """No replica could be reached (or none has a leader yet)."""


class SubmitRefused(ControllerError):
    """The controller refused a request as invalid (HTTP 400)."""


class JobNotFound(ControllerError):
    """No such job (or not the given tenant's)."""


class ControllerClient:
    def __init__(self, urls: Sequence[str] | str, token: str, *, timeout: float = 10.0) -> None:
        if isinstance(urls, str):
            urls = [u for u in urls.split(",") if u.strip()]
        if not urls:
            raise ValueError("no controller URL configured")
        self._urls = [u.strip().rstrip("/") for u in urls]
        self._preferred = 0
        self._lock = threading.Lock()
        self._http = httpx.Client(
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
            limits=httpx.Limits(max_keepalive_connections=32, max_connections=64),
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ControllerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- jobs ---------------------------------------------------------------------

    def submit(self, spec: dict[str, Any], *, idempotency_key: str = "") -> int:
        body: dict[str, Any] = {"spec": spec}
        if idempotency_key:
            body["idempotency_key"] = idempotency_key
        return int(self._request("POST", "/v1/jobs", json=body)["job_id"])

    def jobs(
        self,
        *,
        tenant: str | None = None,
        states: Iterable[str] | None = None,
        ids: Iterable[int] | None = None,
        user: str | None = None,
    ) -> list[dict[str, Any]]:
        params: dict[str, str] = {}
        if tenant is not None:
            params["tenant"] = tenant
        if states:
            params["states"] = ",".join(states)
        if ids:
            params["ids"] = ",".join(str(i) for i in ids)
        if user:
            params["user"] = user
        jobs: list[dict[str, Any]] = self._request("GET", "/v1/jobs", params=params)["jobs"]
        return jobs

    def job(self, job_id: int, *, tenant: str | None = None) -> dict[str, Any]:
        params = {"tenant": tenant} if tenant is not None else {}
        job: dict[str, Any] = self._request("GET", f"/v1/jobs/{int(job_id)}", params=params)
        return job

    def cancel(
        self, job_id: int, *, tenant: str | None = None, signal: int | None = None, by: str = ""
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"by": by}
        if tenant is not None:
            body["tenant"] = tenant
        if signal is not None:
            body["signal"] = signal
        job: dict[str, Any] = self._request("POST", f"/v1/jobs/{int(job_id)}/cancel", json=body)
        return job

    def control(
        self, job_id: int, action: str, *, tenant: str | None = None, admin: bool = False
    ) -> dict[str, Any]:
        """hold, release, requeue or requeuehold (scontrol's verbs); the job as it is now."""
        body: dict[str, Any] = {"admin": admin}
        if tenant is not None:
            body["tenant"] = tenant
        job: dict[str, Any] = self._request("POST", f"/v1/jobs/{int(job_id)}/{action}", json=body)
        return job

    # -- cluster ------------------------------------------------------------------

    def ping(self) -> dict[str, Any]:
        answer: dict[str, Any] = self._request("GET", "/v1/ping")
        return answer

    def nodes(self) -> list[dict[str, Any]]:
        nodes: list[dict[str, Any]] = self._request("GET", "/v1/nodes")["nodes"]
        return nodes

    def partitions(self) -> list[dict[str, Any]]:
        parts: list[dict[str, Any]] = self._request("GET", "/v1/partitions")["partitions"]
        return parts

    # -- agents -------------------------------------------------------------------

    def register_node(self, node: dict[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = self._request("POST", "/v1/nodes/register", json=node)
        return answer

    def heartbeat(self, node: str, running: list[dict[str, int]]) -> dict[str, Any]:
        answer: dict[str, Any] = self._request(
            "POST", f"/v1/nodes/{node}/heartbeat", json={"running": running}
        )
        return answer

    def report_started(self, job_id: int, *, attempt: int, node: str, pid: int) -> None:
        self._request(
            "POST",
            f"/v1/jobs/{int(job_id)}/started",
            json={"attempt": attempt, "node": node, "pid": pid},
        )

    def report_finished(
        self,
        job_id: int,
        *,
        attempt: int,
        node: str,
        exit_code: int,
        signal: int = 0,
        reason: str = "",
    ) -> None:
        self._request(
            "POST",
            f"/v1/jobs/{int(job_id)}/finished",
            json={
                "attempt": attempt,
                "node": node,
                "exit_code": exit_code,
                "signal": signal,
                "reason": reason,
            },
        )

    # -- transport ----------------------------------------------------------------

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        last_error = ""
        with self._lock:
            start = self._preferred
        for step in range(len(self._urls)):
            index = (start + step) % len(self._urls)
            try:
                response = self._http.request(method, self._urls[index] + path, **kwargs)
            except httpx.HTTPError as exc:
                last_error = f"{self._urls[index]}: {exc}"
                continue
            if response.status_code == 503:  # replica without a leader: try another
                last_error = f"{self._urls[index]}: {_message(response)}"
                continue
            with self._lock:
                self._preferred = index
            return _answer(response)
        raise ControllerUnavailable(f"no controller reachable ({last_error})", status=503)


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip() or f"HTTP {response.status_code}"
    if isinstance(body, dict) and "error" in body:
        return str(body["error"])
    return f"HTTP {response.status_code}"


def _answer(response: httpx.Response) -> Any:
    if response.status_code < 400:
        return response.json()
    message = _message(response)
    code = ""
    with contextlib.suppress(ValueError, AttributeError):
        code = str(response.json().get("code", ""))
    if response.status_code == 404:
        raise JobNotFound(message, status=404, code=code)
    if response.status_code in (400, 409, 422):
        raise SubmitRefused(message, status=response.status_code, code=code)
    raise ControllerError(message, status=response.status_code, code=code)
