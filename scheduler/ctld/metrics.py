"""The controller's Prometheus metrics (`GET /metrics` on its HTTP port).

Everything is read at scrape time from the replica (a custom collector on a registry of
its own, no global state): Raft role, term, commit index, apply lag and log size; the
last scheduling pass's duration and a count and sum of them; jobs by state and nodes by
state. Only counts: no job, user, tenant, account or node name appears in a label, so
the route is served without the cluster token (a scraper then needs no credential that
could also submit or cancel jobs). Each replica reports its own view; `spur_raft_leader`
tells which one leads.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from scheduler.core.contract import JobState

if TYPE_CHECKING:
    from scheduler.ctld.controller import Controller

NODE_STATES = ("idle", "mix", "alloc", "down", "drain")


class PassStats:
    """How long the leader's scheduling passes take (set by the scheduling loop)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0
        self.total_s = 0.0
        self.last_s = 0.0

    def observe(self, seconds: float) -> None:
        with self._lock:
            self.count += 1
            self.total_s += seconds
            self.last_s = seconds

    def timed(self) -> _Timed:
        return _Timed(self)

    def snapshot(self) -> tuple[int, float, float]:
        with self._lock:
            return self.count, self.total_s, self.last_s


class _Timed:
    def __init__(self, stats: PassStats) -> None:
        self._stats = stats
        self._start = 0.0

    def __enter__(self) -> None:
        self._start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self._stats.observe(time.perf_counter() - self._start)


class ControllerCollector(Collector):
    def __init__(self, controller: Controller) -> None:
        self._controller = controller

    def collect(self) -> Iterator[Metric]:
        ctl = self._controller
        raft = ctl.replica.raft_info()

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, value=value)

        yield gauge(
            "spur_raft_leader", "1 if this replica is the Raft leader", raft["role"] == "leader"
        )
        yield gauge("spur_raft_term", "this replica's current Raft term", raft["term"])
        yield gauge(
            "spur_raft_commit_index", "the highest log index known committed", raft["commit_index"]
        )
        yield gauge(
            "spur_raft_last_applied",
            "the highest log index applied to the state",
            raft["last_applied"],
        )
        yield gauge(
            "spur_raft_apply_lag_entries",
            "committed entries not yet applied on this replica",
            max(raft["commit_index"] - raft["last_applied"], 0),
        )
        yield gauge(
            "spur_raft_log_entries",
            "entries in the log since the last snapshot",
            raft["log_entries"],
        )
        yield gauge(
            "spur_raft_members",
            "replicas in the Raft group, this one included",
            len(raft["members"]),
        )
        yield gauge(
            "spur_raft_connected_peers",
            "other members this replica is connected to",
            len(raft["connected"]),
        )
        if raft["match_index"]:
            lag = GaugeMetricFamily(
                "spur_raft_follower_lag_entries",
                "on the leader: entries each follower has yet to store",
                labels=["peer"],
            )
            for peer, match in sorted(raft["match_index"].items()):
                lag.add_metric([peer], max(raft["log_last_index"] - match, 0))
            yield lag

        count, total, last = ctl.pass_stats.snapshot()
        yield gauge(
            "spur_scheduling_last_pass_seconds",
            "duration of the last scheduling pass on this replica",
            last,
        )
        yield CounterMetricFamily(
            "spur_scheduling_passes", "scheduling passes this replica ran (as leader)", value=count
        )
        yield CounterMetricFamily(
            "spur_scheduling_pass_seconds_total", "time spent in scheduling passes", value=total
        )

        with ctl.replica.lock:
            state = ctl.replica.state
            jobs: Counter[str] = Counter()
            for job in state.jobs.values():
                jobs[job.state.value] += job.task_count  # an array's remainder: its tasks
            nodes = Counter(node.to_dict()["state"] for node in state.nodes.values())
        job_family = GaugeMetricFamily(
            "spur_jobs", "jobs the controller holds, by state", labels=["state"]
        )
        for job_state in JobState:
            job_family.add_metric([job_state.value], jobs.get(job_state.value, 0))
        yield job_family
        yield gauge("spur_jobs_pending", "pending jobs", jobs.get(JobState.PENDING.value, 0))
        yield gauge("spur_jobs_running", "running jobs", jobs.get(JobState.RUNNING.value, 0))
        node_family = GaugeMetricFamily(
            "spur_nodes", "registered nodes, by state", labels=["state"]
        )
        for node_state in sorted(set(NODE_STATES) | set(nodes)):
            node_family.add_metric([node_state], nodes.get(node_state, 0))
        yield node_family


def registry_for(controller: Controller) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ControllerCollector(controller))
    return registry


def render(registry: CollectorRegistry) -> tuple[bytes, str]:
    """The exposition text and its content type."""
    return generate_latest(registry), CONTENT_TYPE_LATEST
