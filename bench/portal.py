"""The portal's pages and its live table, with 1,000 jobs in the organisation.

Starts the embedded platform the way bench/e2e.py does (SQLite, file-system broker, one
controller, two simulated 8-GPU nodes, uvicorn on loopback), writes 1,000 finished jobs
into the organisation's history (as the controller's events would: the core's own job
dicts, through `jobobject.record_fields`), signs the demo user in (a session made by
Django's own session store), and measures:

  pages    the dashboard, the job list (/jobs/, its first page of 50) and a job's page,
           each fetched by 8 concurrent clients (own keep-alive connection each) PER_CLIENT
           times: p50 and p99 in ms
  queries  SQL queries per page (Django's test client and CaptureQueriesContext, in a
           `manage shell`), with 10 jobs in the history and with 1,000: they must not grow
  fan-out  100 browsers' websockets on /ws/jobs/; a held job is cancelled through the API
           (ROUNDS times); each browser's delay from just before the POST to the message
           that shows it CANCELLED: p50 and p99 over every browser and round

The channel layer is the platform's: Redis when REDIS_URL (or CHANNEL_LAYER_URL) says so,
else the in-memory layer of the embedded platform. Either way the cancel is pushed from
the web process that serves the sockets (act_on_job, on commit), so both measure the
push; the worker's event follows and changes nothing (same seq).

    python bench/portal.py
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import websockets

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from embedded import on_platform  # noqa: E402

from spurcloud.stack import Stack  # noqa: E402

JOBS = 1000
CLIENTS = 8
PER_CLIENT = 40
BROWSERS = 100
ROUNDS = 5
NODES = [(f"node{i:02d}", "mi300x-8") for i in range(1, 3)]
HISTORY_BASE_ID = 50_000_000  # far above what the controller hands out
LIMITS = {
    "API_REQUESTS_PER_MINUTE_PER_TOKEN": "10000000",
    "API_REQUESTS_PER_MINUTE_PER_IP": "10000000",
    "API_SUBMISSIONS_PER_MINUTE_PER_ORGANIZATION": "10000000",
}

FILL_HISTORY = """
import time
from django.conf import settings
from scheduler.core.contract import JobSpec
from scheduler.core.jobs import Job
from spurcloud.jobs import jobobject
from spurcloud.jobs.models import JobRecord
from spurcloud.tenants.models import Organization

slug, user, base, count = {args}
organization = Organization.objects.get(slug=slug)
now = time.time()
rows = []
for i in range(count):
    spec = JobSpec(script="#!/bin/sh\\ntrue\\n", name=f"done-{i}", tenant=slug, user=user,
                   workdir="/tmp", gpus_per_node=1)
    job = Job(job_id=base + i, spec=spec, partition="gpu", account=slug, time_limit_min=60,
              submit_time=now - 60, eligible_time=now - 60)
    out = job.to_dict(dependency="(null)")
    out.update(state="COMPLETED", reason="None", start_time=now - 50, end_time=now - 40,
               exit_code=0, signal=0, nodes=["node01"], num_nodes=1)
    rows.append(JobRecord(cluster=settings.SPUR_CLUSTER_NAME, job_id=base + i,
                          organization=organization, last_seq=0,
                          **jobobject.record_fields(out)))
JobRecord.objects.bulk_create(rows, batch_size=500)
print(JobRecord.objects.filter(organization=organization).count())
"""

SESSION = """
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.contrib.sessions.backends.db import SessionStore
user = get_user_model().objects.get(username="admin")
session = SessionStore()
session[SESSION_KEY] = str(user.pk)
session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
session[HASH_SESSION_KEY] = user.get_session_auth_hash()
session.create()
print(session.session_key)
"""

QUERIES = """
import json
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
client = Client(HTTP_HOST="127.0.0.1")
client.force_login(get_user_model().objects.get(username="admin"))
out = {{}}
for name, path in {pages}:
    client.get(path)  # the session's first reads
    with CaptureQueriesContext(connection) as queries:
        assert client.get(path).status_code == 200, path
    out[name] = len(queries)
print(json.dumps(out))
"""


def pages(job_id: int) -> list[tuple[str, str]]:
    return [("dashboard", "/"), ("jobs", "/jobs/"), ("job", f"/jobs/{job_id}/")]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def queries_per_page(stack: Stack, job_id: int) -> dict[str, int]:
    out = stack.manage("shell", "-c", QUERIES.format(pages=repr(pages(job_id))))
    counts: dict[str, int] = json.loads(out.strip().splitlines()[-1])
    return counts


def page_latencies(stack: Stack, session: str, path: str) -> list[float]:
    def client_run(_: int) -> list[float]:
        times = []
        with httpx.Client(base_url=stack.web_url, cookies={"sessionid": session}) as web:
            web.get(path).raise_for_status()  # its connection, warm
            for _ in range(PER_CLIENT):
                t0 = time.perf_counter()
                web.get(path).raise_for_status()
                times.append((time.perf_counter() - t0) * 1000)
        return times

    with ThreadPoolExecutor(CLIENTS) as pool:
        return [t for times in pool.map(client_run, range(CLIENTS)) for t in times]


async def fan_out(stack: Stack, session: str, token: str) -> list[float]:
    """Each browser's delay (ms) from the cancel request to its CANCELLED row."""
    url = stack.web_url.replace("http://", "ws://") + "/ws/jobs/"
    headers = {"Cookie": f"sessionid={session}", "Origin": stack.web_url}
    sockets = [
        await websockets.connect(url, additional_headers=headers, max_queue=None)
        for _ in range(BROWSERS)
    ]
    delays: list[float] = []
    api = httpx.AsyncClient(base_url=stack.web_url, headers={"Authorization": f"Bearer {token}"})
    try:
        for _ in range(ROUNDS):
            spec = {"script": "#!/bin/sh\ntrue\n", "name": "fanout", "hold": True}
            job = (await api.post("/api/v1/jobs", json=spec)).raise_for_status().json()
            await asyncio.sleep(1.5)  # its own events (PENDING) reach every browser first

            async def cancelled(socket: Any, job_id: int = int(job["job_id"])) -> float:
                while True:
                    message = json.loads(await socket.recv())
                    body = message.get("job", {})
                    if body.get("job_id") == job_id and body.get("state") == "CANCELLED":
                        return time.perf_counter()

            waits = [asyncio.create_task(cancelled(s)) for s in sockets]
            t0 = time.perf_counter()
            (await api.post(f"/api/v1/jobs/{job['job_id']}/cancel", json={})).raise_for_status()
            arrived = await asyncio.wait_for(asyncio.gather(*waits), timeout=60)
            delays.extend((t - t0) * 1000 for t in arrived)
    finally:
        await api.aclose()
        for socket in sockets:
            await socket.close()
    return delays


def main() -> int:
    return on_platform("spur-bench-portal-", NODES, run, env=LIMITS)


def run(stack: Stack, creds: dict[str, str]) -> int:
    slug = creds["organization"]
    stack.manage(
        "shell", "-c", FILL_HISTORY.replace("{args}", repr((slug, "admin", HISTORY_BASE_ID, 10)))
    )
    few = queries_per_page(stack, HISTORY_BASE_ID)
    args = (slug, "admin", HISTORY_BASE_ID + 10, JOBS - 10)
    history = int(
        stack.manage("shell", "-c", FILL_HISTORY.replace("{args}", repr(args))).split()[-1]
    )
    job_id = HISTORY_BASE_ID + JOBS // 2
    many = queries_per_page(stack, job_id)
    session = stack.manage("shell", "-c", SESSION).strip().splitlines()[-1]

    latencies = {name: page_latencies(stack, session, path) for name, path in pages(job_id)}
    delays = asyncio.run(fan_out(stack, session, creds["token"]))
    layer = (
        "redis"
        if "redis" in stack.env.get("CHANNEL_LAYER_URL", stack.env.get("REDIS_URL", ""))
        else "in-memory"
    )

    print(f"Spur-Cloud portal: {history} jobs in the organisation, {CLIENTS} clients on loopback")
    print(
        f"{'page':<12}{'p50 ms':>10}{'p99 ms':>10}{'queries (10 jobs)':>20}{'queries (1000)':>16}"
    )
    for name, _ in pages(job_id):
        times = latencies[name]
        print(
            f"{name:<12}{statistics.median(times):>10.1f}{percentile(times, 0.99):>10.1f}"
            f"{few[name]:>20}{many[name]:>16}"
        )
    print(
        f"websocket fan-out to {BROWSERS} browsers ({layer} layer, {ROUNDS} rounds): "
        f"p50 {statistics.median(delays):.1f} ms, p99 {percentile(delays, 0.99):.1f} ms"
    )
    out = {
        "bench": "portal",
        "dashboard_p50_ms": round(statistics.median(latencies["dashboard"]), 1),
        "dashboard_p99_ms": round(percentile(latencies["dashboard"], 0.99), 1),
        "jobs_p99_ms": round(percentile(latencies["jobs"], 0.99), 1),
        "queries_per_page": max(many.values()),
        "ws_fanout_p99_ms": round(percentile(delays, 0.99), 1),
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
