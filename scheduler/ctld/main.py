"""`spurctld`: run one controller replica."""

from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import signal
import sys
import threading

from scheduler import config as spur_config
from scheduler.ctld.api import build_app
from scheduler.ctld.controller import Controller, signing_key
from scheduler.ctld.replica import InsecureGroup
from scheduler.rpc import serving
from scheduler.rpc.signatures import node_key

# The cyclic collector's first threshold (700 by default): every 700 objects that outlive
# their request (a submission leaves a few dozen in the state) a young collection, and
# every 100 of those a full one over the whole state. Raft's and the state's objects
# are not cycles that need it; refcounting frees a request's. Raised, the collector
# runs a few times a second under load instead of hundreds.
GC_THRESHOLD = (20_000, 10, 10)
# The interpreter's thread switch interval (5 ms by default): the Raft thread, which
# every commit waits on, gets the GIL back this soon from the event loop's thread.
SWITCH_INTERVAL_S = 0.0005


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="spurctld", description="Spur controller replica")
    parser.add_argument("--config", "-f", help="spur.toml (default: built-in settings)")
    parser.add_argument("--listen", help="HTTP address HOST:PORT (overrides controller.listen)")
    parser.add_argument("--raft-address", help="this replica's Raft HOST:PORT")
    parser.add_argument("--raft-peers", help="comma list of the other replicas' Raft addresses")
    parser.add_argument("--state-dir", help="directory of the Raft journal")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument(
        "--print-credential",
        metavar="NODE",
        help="print NODE's credential (for its agent's spool/credential file) and exit",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s spurctld %(levelname)s %(name)s: %(message)s",
    )
    try:
        cfg = spur_config.load(args.config)
    except spur_config.ConfigError as exc:
        print(f"spurctld: error: {exc}", file=sys.stderr)
        return 2
    overrides = {
        "listen": args.listen,
        "raft_address": args.raft_address,
        "state_dir": args.state_dir,
    }
    ctl = cfg.controller
    ctl = dataclasses.replace(ctl, **{k: v for k, v in overrides.items() if v})
    if args.raft_peers is not None:
        ctl = dataclasses.replace(ctl, raft_peers=tuple(p for p in args.raft_peers.split(",") if p))
    cfg = dataclasses.replace(cfg, controller=ctl)

    if args.print_credential:
        try:
            key = signing_key(ctl)
        except InsecureGroup as exc:
            print(f"spurctld: error: {exc}", file=sys.stderr)
            return 2
        print(node_key(key, args.print_credential).hex())
        return 0
    try:
        controller = Controller(cfg)
    except InsecureGroup as exc:
        print(f"spurctld: error: {exc}", file=sys.stderr)
        return 2
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    controller.start()
    # What the start made (modules, the journal's state) is not garbage: the collector's
    # full passes skip it from now on.
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)
    host, _, port = ctl.listen.rpartition(":")
    # uvloop and httptools, no access log, each answer written once (scheduler/rpc/serving.py).
    server = serving.server(build_app(controller, cfg.token), host or "127.0.0.1", int(port))
    stopping = threading.Event()

    def shutdown(signum: int, frame: object) -> None:
        stopping.set()
        server.should_exit = True

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    logging.getLogger(__name__).info(
        "spurctld %s serving on %s (raft %s, peers %s)",
        cfg.cluster_name,
        ctl.listen,
        ctl.raft_address,
        ",".join(ctl.raft_peers) or "none",
    )
    server.run()
    controller.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
