"""CPU a call of the RPC kit's client costs its caller, by transport: httpx (what
`scheduler.rpc.client` used), `http.client` over kept connections (what it uses now), and
the CLI's own HTTP/1.1 (`scheduler.cli.http`), each against the same small server in
another process (the stdlib's, HTTP/1.1, keep-alive), one thread calling.

    python bench/rpc_transport.py [--calls 3000]

Prints microseconds of this process's CPU (user and system) a call and calls a second,
then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from scheduler.cli.http import Connection  # noqa: E402
from scheduler.rpc.client import RpcClient  # noqa: E402

SERVER = r"""
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # its head and body go in two writes
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = b'{"job": {"job_id": 1, "state": "PENDING"}}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"""

BODY = {"spec": {"script": "#!/bin/sh\ntrue\n", "gpus_per_node": 1}, "idempotency_key": "k"}


def measure(name: str, call: object, calls: int) -> dict[str, float]:
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
    args = parser.parse_args()
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        url = f"http://127.0.0.1:{int(server.stdout.readline())}"
        results: dict[str, dict[str, float]] = {}
        with httpx.Client(headers={"Authorization": "Bearer t"}, timeout=10) as hx:
            results["httpx"] = measure(
                "httpx", lambda: hx.post(url + "/v1/jobs", json=BODY).json(), args.calls
            )
        with RpcClient([url], "t") as rpc:
            results["rpc_client"] = measure(
                "rpc", lambda: rpc.call("POST", "/v1/jobs", json=BODY), args.calls
            )
        cli = Connection("http", "127.0.0.1", int(url.rsplit(":", 1)[1]), timeout=10)
        payload = json.dumps(BODY).encode()
        head = {"Authorization": "Bearer t", "Content-Type": "application/json"}
        results["cli_http"] = measure(
            "cli", lambda: json.loads(cli.request("POST", "/v1/jobs", head, payload)[1]), args.calls
        )
        cli.close()
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
