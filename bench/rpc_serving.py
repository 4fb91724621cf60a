"""CPU the controller's HTTP serving path costs a request, in process, without sockets:
uvicorn's protocol as spurctld configures it (`scheduler.rpc.serving`), an RPC app with a
submission-like route (the body read and decoded, a job's answer encoded), and a
transport that counts what is written.

On loopback the kernel's part of a request (the read, the write that delivers the answer
and wakes the client) is tens of microseconds and swings with whatever else the machine
runs; bench/raft.py and bench/e2e.py see it all. This bench leaves it out, so that a
change to the Python of the path (parsing, routing, the token, JSON, the answer's head)
shows as a steady figure on a busy machine: each round feeds one request to each of
CONNECTIONS connections and lets the event loop answer them all.

    python bench/rpc_serving.py [--requests 300] [--rounds 5]

Prints microseconds of CPU a request (the median of the rounds, and each round), then
one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import uvloop  # noqa: E402

from scheduler.rpc import serving  # noqa: E402
from scheduler.rpc.server import Call, RpcRoute, rpc_app  # noqa: E402
from tests.scheduler.core.factories import spec  # noqa: E402

CONNECTIONS = 32
TOKEN = "bench-token"


class CountingTransport(asyncio.Transport):
    """What the protocol writes, counted (answers) and dropped."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0
        self.closing = False

    def write(self, data: Any) -> None:
        self.writes += 1

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 6817)}.get(
            name, default
        )

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def request() -> bytes:
    """A held job's submission as http.client sends it (bench/raft.py's)."""
    body = json.dumps({"spec": spec(name="rpc-serving", hold=True).to_dict()}).encode()
    head = (
        "POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1:6817\r\nAccept-Encoding: identity\r\n"
        f"Content-Length: {len(body)}\r\nAuthorization: Bearer {TOKEN}\r\n"
        "Content-Type: application/json\r\n\r\n"
    )
    return head.encode() + body


async def submit(call: Call) -> Any:
    await call.body()
    job = {"job_id": 1, "state": "PENDING", "name": "rpc-serving", "user": "alice"}
    return 201, {"job_id": 1, "job": job}


async def measure(requests: int, rounds: int) -> list[float]:
    app = rpc_app([RpcRoute("/v1/jobs", submit, ("POST",))], token=TOKEN)
    config = serving.server(app, "127.0.0.1", 0).config
    config.load()
    server = serving.uvicorn.Server(config)
    state = server.server_state
    state.default_headers = [(b"date", b"Sun, 06 Dec 2026 10:00:00 GMT"), *config.encoded_headers]
    connections = []
    for _ in range(CONNECTIONS):
        protocol = config.http_protocol_class(config=config, server_state=state, app_state={})
        transport = CountingTransport()
        protocol.connection_made(transport)
        connections.append((protocol, transport))
    data = request()

    async def one_round() -> None:
        for protocol, _ in connections:
            protocol.data_received(data)
        while any(t.writes < expected for _, t in connections):
            await asyncio.sleep(0)

    expected = 0
    for _ in range(20):  # warm up
        expected += 1
        await one_round()
    results = []
    for _ in range(rounds):
        cpu0 = time.process_time()
        for _ in range(requests):
            expected += 1
            await one_round()
        results.append((time.process_time() - cpu0) / (requests * CONNECTIONS) * 1e6)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    results = uvloop.run(measure(args.requests, args.rounds))
    median = statistics.median(results)
    rounds = " ".join(f"{r:.1f}" for r in results)
    print(f"serving a submission: {median:.1f} us of CPU a request (rounds: {rounds})")
    print(json.dumps({"bench": "rpc_serving", "cpu_us_per_request": round(median, 2)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
