"""CPU a call of the RPC kit's client costs its caller, by transport: httpx (what
`scheduler.rpc.client` used first), the standard library's `http.client` over a kept
connection (what it used next), the kit's own HTTP/1.1 (`scheduler.rpc.http`, what it and
the CLI use now) bare, and the whole `RpcClient` call over it (the body to JSON, the
answer read back, failover's bookkeeping). Each calls the same RPC app (the kit's server,
a route answering a job, served as the services serve it: `scheduler.rpc.serving`) in
another process, one thread calling, over one kept-alive connection.

    python bench/rpc_transport.py [--calls 3000] [--rounds 1]

Prints microseconds of this process's CPU (user and system) a call and calls a second
(the best of the rounds, which run the transports in turn), then one JSON line.
"""

from __future__ import annotations

import argparse
import http.client
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import orjson  # noqa: E402

from scheduler.rpc.client import RpcClient  # noqa: E402
from scheduler.rpc.http import Connection  # noqa: E402

SERVER = r"""
import socket, sys
sys.path.insert(0, sys.argv[1])
from scheduler.rpc import serving
from scheduler.rpc.server import Call, RpcRoute, rpc_app

async def submit(call: Call):
    await call.body()
    return {"job": {"job_id": 1, "state": "PENDING", "name": "wrap", "user": "alice"}}

sock = socket.socket()
sock.bind(("127.0.0.1", 0))
print(sock.getsockname()[1], flush=True)
app = rpc_app([RpcRoute("/v1/jobs", submit, ("POST",))], token="t")
# Kept connections stay open while the other transports take their turns.
serving.server(app, "127.0.0.1", 0, timeout_keep_alive=600).run(sockets=[sock])
"""

BODY = {"spec": {"script": "#!/bin/sh\ntrue\n", "gpus_per_node": 1}, "idempotency_key": "k"}


def measure(call: object, calls: int) -> dict[str, float]:
    for _ in range(50):
        call()  # type: ignore[operator]
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(calls):
        call()  # type: ignore[operator]
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {"cpu_us_per_call": round(cpu / calls * 1e6, 1), "calls_per_s": round(calls / wall)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(ROOT)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        url = f"http://127.0.0.1:{port}"
        time.sleep(0.5)  # the server's start: it listens once its loop runs
        head = {"Authorization": "Bearer t", "Content-Type": "application/json"}
        hx = httpx.Client(headers={"Authorization": "Bearer t"}, timeout=10)
        stdlib = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        wire = Connection("http", "127.0.0.1", port, timeout=10)
        rpc = RpcClient([url], "t")

        def with_stdlib() -> object:
            stdlib.request("POST", "/v1/jobs", body=orjson.dumps(BODY), headers=head)
            return orjson.loads(stdlib.getresponse().read())

        transports = {
            "httpx": lambda: hx.post(url + "/v1/jobs", json=BODY).json(),
            "http_client": with_stdlib,
            "wire": lambda: orjson.loads(
                wire.request("POST", "/v1/jobs", head, orjson.dumps(BODY))[1]
            ),
            "rpc_client": lambda: rpc.call("POST", "/v1/jobs", json=BODY),
        }
        results: dict[str, dict[str, float]] = {}
        for _ in range(args.rounds):
            for name, call in transports.items():
                row = measure(call, args.calls)
                best = results.get(name)
                if best is None or row["cpu_us_per_call"] < best["cpu_us_per_call"]:
                    results[name] = row
        hx.close()
        stdlib.close()
        wire.close()
        rpc.close()
    finally:
        server.kill()
        server.wait()
    print(f"{'transport':<14}{'CPU us/call':>12}{'calls/s':>10}")
    for name, row in results.items():
        print(f"{name:<14}{row['cpu_us_per_call']:>12}{row['calls_per_s']:>10}")
    print(json.dumps({"bench": "rpc_transport", "calls": args.calls, **results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
