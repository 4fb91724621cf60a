"""A real HTTP server on loopback that answers like the web API, from canned data.

The CLI's tests talk to it over a socket, as the commands talk to the real web API, and
read back what each request asked for.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest

from scheduler.core.contract import runs, select_fields
from scheduler.core.contract.job_object import JOB_FIELDS, TIME_FIELDS, to_columns
from scheduler.slurm.timefmt import parse_iso

# The list filters the web API applies (spurcloud/api/views.py): each a comma-separated
# list of which any value matches; an id names a job or every task of the array job it is.
_LIST_FILTERS = {"state": "state", "user": "user", "account": "account", "partition": "partition"}


def _matches(item: dict[str, Any], query: dict[str, list[str]], *, names_list: bool) -> bool:
    if "id" in query:
        wanted = {int(i) for i in query["id"][0].split(",") if i}
        if item.get("job_id") not in wanted and item.get("array_job_id") not in wanted:
            return False
    filters = dict(_LIST_FILTERS)
    if "name" in query:
        if names_list:
            filters["name"] = "name"
        elif item.get("name") != query["name"][0]:
            return False  # the history takes one name
    for key, field_name in filters.items():
        if key in query and query[key][0] and item.get(field_name) not in query[key][0].split(","):
            return False
    return True


def _epochs(item: dict[str, Any]) -> dict[str, Any]:
    """A job object of the rows answer (ISO times) with its times as the columns answer
    gives them (epoch seconds)."""
    out = dict(item)
    for name in TIME_FIELDS & set(out):
        moment = parse_iso(out[name]) if isinstance(out[name], str) else None
        out[name] = None if moment is None else moment.timestamp()
    return out


@dataclass
class FakeApi:
    token: str = "spur_test"
    jobs: dict[int, dict[str, Any]] = field(default_factory=dict)
    queue: list[dict[str, Any]] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    nodes: list[dict[str, Any]] = field(default_factory=list)
    partitions: list[dict[str, Any]] = field(default_factory=list)
    refuse_submit: str = ""
    refuse_submit_status: int = 400  # 402: the organisation's credit is used up
    refuse_submit_code: str = ""  # the controller's code, as the web API passes it on
    cluster_name: str = "spur"  # GET /api/v1/config's ClusterName
    config: dict[str, str] = field(default_factory=dict)  # and its other pairs
    # Where a test wants a real answer to a submission (a ClusterState's): body ->
    # (status, answer). Otherwise each job is taken, numbered from next_id.
    on_submit: Callable[[dict[str, Any]], tuple[int, Any]] | None = None
    page_size: int = 2
    requests: list[tuple[str, str, dict[str, list[str]], Any]] = field(default_factory=list)
    next_id: int = 100
    url: str = ""
    # A job's output as it grows: (job id, stream) -> what each read finds in turn, the
    # last one staying (text so far, or None before the job has any; still running).
    outputs: dict[tuple[int, str], list[tuple[str | None, bool]]] = field(default_factory=dict)

    def output(self, job_id: int, query: dict[str, list[str]]) -> tuple[int, Any]:
        stream = query.get("stream", ["stdout"])[0]
        feed = self.outputs.get((job_id, stream))
        if job_id not in self.jobs or not feed:
            return 404, {"detail": f"job {job_id} has no output"}
        text, running = feed.pop(0) if len(feed) > 1 else feed[0]
        if text is None:
            return 404, {"detail": f"job {job_id} has not started"}
        raw = text.encode()
        offset = int(query.get("offset", ["0"])[0])
        limit = int(query.get("limit", [str(self.output_chunk)])[0])
        data = raw[offset : offset + min(limit, self.output_chunk)]
        return 200, {
            "job_id": job_id,
            "attempt": 0,
            "stream": stream,
            "offset": offset,
            "next_offset": offset + len(data),
            "size": len(raw),
            "data": data.decode(),
            "running": running,
        }

    output_chunk: int = 4  # bytes a read gives at most, to make the client read on

    def answer(
        self, method: str, path: str, query: dict[str, list[str]], body: Any
    ) -> tuple[int, Any]:
        self.requests.append((method, path, query, body))
        if method == "POST" and path == "/api/v1/jobs":
            if self.on_submit is not None:
                return self.on_submit(body)
            if self.refuse_submit:
                refusal = {"detail": self.refuse_submit, "code": self.refuse_submit_code}
                return self.refuse_submit_status, refusal
            job = {"job_id": self.next_id, "state": "PENDING", "spec": body}
            self.jobs[self.next_id] = job
            self.next_id += 1
            return 201, job
        if method == "GET" and path.startswith("/api/v1/jobs/") and path.endswith("/output"):
            return self.output(int(path.split("/")[-2]), query)
        if method == "GET" and path.startswith("/api/v1/jobs/"):
            job_id = int(path.rsplit("/", 1)[1])
            if job_id not in self.jobs:
                return 404, {"detail": "Not found."}
            return 200, self.jobs[job_id]
        if method == "POST" and path.endswith("/cancel"):
            job_id = int(path.split("/")[-2])
            if job_id not in self.jobs:
                return 404, {"detail": "Not found."}
            return 200, self.jobs[job_id]
        if method == "GET" and path == "/api/v1/config":
            return 200, {"config": {"ClusterName": self.cluster_name, **self.config}}
        lists = {
            "/api/v1/queue": self.queue,
            "/api/v1/jobs": self.history,
            "/api/v1/nodes": self.nodes,
            "/api/v1/partitions": self.partitions,
        }
        if method == "GET" and path in lists:
            items = lists[path]
            if path in ("/api/v1/queue", "/api/v1/jobs"):  # filtered as the API filters
                queue = path == "/api/v1/queue"
                items = [item for item in items if _matches(item, query, names_list=queue)]
            offset = int(query.get("offset", ["0"])[0])
            page = items[offset : offset + self.page_size]
            more = offset + self.page_size < len(items)
            # `next` carries the filters, as the real API's does.
            carried = {k: v[0] for k, v in query.items() if k != "offset"}
            carried["offset"] = str(offset + self.page_size)
            following = f"{self.url}{path}?{urlencode(carried)}" if more else None
            if query.get("shape") in (["columns"], ["runs"]):
                named = query["fields"][0].split(",") if "fields" in query else None
                fields = select_fields(named or [f.name for f in JOB_FIELDS if f.always])
                answer = to_columns([_epochs(item) for item in page], fields)
                if query["shape"] == ["runs"]:
                    answer["columns"] = runs.encode(answer["columns"])
                return 200, {**answer, "next": following}
            if "fields" in query:  # cut as the API cuts them: what was not asked for is absent
                fields = select_fields(query["fields"][0].split(","))
                page = [{k: item[k] for k in fields if k in item} for item in page]
            return 200, {"results": page, "next": following}
        return 404, {"detail": "Not found."}


def _handler(api: FakeApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
            pass

        def _serve(self, method: str) -> None:
            if self.headers.get("Authorization") != f"Bearer {api.token}":
                self._send(401, {"detail": "Invalid token."})
                return
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            parts = urlsplit(self.path)
            status, data = api.answer(method, parts.path, parse_qs(parts.query), body)
            self._send(status, data)

        def _send(self, status: int, data: Any) -> None:
            raw = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self._serve("GET")

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self._serve("POST")

    return Handler


@pytest.fixture
def fake_api(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeApi]:
    api = FakeApi()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(api))
    api.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    monkeypatch.setenv("SPUR_API_URL", api.url)
    monkeypatch.setenv("SPUR_TOKEN", api.token)
    monkeypatch.setenv("SPUR_USER", "root")
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()
