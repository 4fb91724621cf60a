"""Registration and heartbeats, against a stand-in controller (no HTTP)."""

from __future__ import annotations

import signal
import threading
from typing import Any

import pytest

from agents.devices import discover_node
from agents.node import NodeMembership
from agents.supervisor import Lease
from scheduler.rpc.errors import NotFound, Refused, Unavailable


class StandInController:
    def __init__(self, *, down_for: int = 0, kill: list[dict[str, Any]] | None = None) -> None:
        self.down_for = down_for
        self.kill = kill or []
        self.registrations: list[dict[str, Any]] = []
        self.heartbeats: list[tuple[str, list[dict[str, int]]]] = []
        self.forget = False
        self.refuse = False

    def register_node(self, node: dict[str, Any], *, proof: str = "") -> dict[str, Any]:
        if self.refuse:
            raise Refused("invalid node")
        if self.down_for:
            self.down_for -= 1
            raise Unavailable("down")
        self.registrations.append(node)
        self.forget = False
        return {"heartbeat_interval_s": 0.01}

    def heartbeat(
        self, node: str, running: list[dict[str, int]], *, timeout_s: float | None = None
    ) -> dict[str, Any]:
        if self.forget:
            raise NotFound("unknown node")
        self.heartbeats.append((node, running))
        kill, self.kill = self.kill, []
        return {"kill": kill, "lease_s": 5.0}


class StandInJobs:
    def __init__(self) -> None:
        self.jobs = [{"job_id": 4, "attempt": 1, "pid": 4242}]
        self.signals: list[tuple[int, int, int]] = []

    def running(self) -> list[dict[str, int]]:
        return list(self.jobs)

    def signal(
        self, job_id: int, attempt: int, signum: int, *, kill_after_s: float | None = None
    ) -> bool:
        self.signals.append((job_id, attempt, signum))
        return True


def _membership(controller: StandInController, jobs: StandInJobs) -> NodeMembership:
    node = discover_node(name="sim01", agent_url="http://127.0.0.1:6818", devices="sim:h100-8")
    return NodeMembership(node=node, controller=controller, jobs=jobs, max_backoff_s=0.01)


def test_registration_is_retried_until_a_controller_answers() -> None:
    controller = StandInController(down_for=3)
    membership = _membership(controller, StandInJobs())
    assert membership.register(threading.Event()) is True
    assert len(controller.registrations) == 1
    assert controller.registrations[0]["name"] == "sim01"
    assert len(controller.registrations[0]["gpus"]) == 8
    assert membership.interval == 0.01  # the controller's interval wins


def test_a_refused_registration_is_not_retried() -> None:
    controller = StandInController()
    controller.refuse = True
    with pytest.raises(Refused):
        _membership(controller, StandInJobs()).register(threading.Event())


def test_a_heartbeat_reports_running_jobs_and_kills_what_the_controller_lists() -> None:
    controller = StandInController(kill=[{"job_id": 9, "attempt": 2}, {"bogus": True}])
    jobs = StandInJobs()
    membership = _membership(controller, jobs)
    membership.heartbeat()
    assert controller.heartbeats == [("sim01", [{"job_id": 4, "attempt": 1}])]
    assert jobs.signals == [(9, 2, signal.SIGKILL)]


def test_a_heartbeat_lists_jobs_whose_end_is_not_yet_acknowledged() -> None:
    controller = StandInController()
    node = discover_node(name="sim01", agent_url="http://127.0.0.1:6818", devices="sim:h100-8")
    membership = NodeMembership(
        node=node,
        controller=controller,
        jobs=StandInJobs(),
        ending=lambda: [(3, 2), (4, 1)],  # job 4 is also still running: listed once
    )
    membership.heartbeat()
    assert controller.heartbeats == [
        ("sim01", [{"job_id": 3, "attempt": 2}, {"job_id": 4, "attempt": 1}])
    ]


def test_a_controller_that_forgot_the_node_gets_it_registered_again() -> None:
    controller = StandInController()
    membership = _membership(controller, StandInJobs())
    stop = threading.Event()
    thread = threading.Thread(target=membership.run, args=(stop,), daemon=True)
    thread.start()
    try:
        assert membership.registered.wait(5)
        controller.forget = True
        deadline = threading.Event()
        for _ in range(500):
            if len(controller.registrations) >= 2 and controller.heartbeats:
                break
            deadline.wait(0.01)
    finally:
        stop.set()
        thread.join(5)
    assert len(controller.registrations) >= 2


def test_an_acknowledged_heartbeat_renews_the_lease_and_tells_the_jobs() -> None:
    controller = StandInController()
    contacts: list[float] = []
    lease = Lease()
    node = discover_node(name="sim01", agent_url="http://127.0.0.1:6818", devices="sim:h100-8")
    membership = NodeMembership(
        node=node,
        controller=controller,
        jobs=StandInJobs(),
        lease=lease,
        on_contact=lambda: contacts.append(lease.left()),
    )
    assert lease.left() == 0.0  # never granted: no job may start
    stop = threading.Event()
    thread = threading.Thread(target=membership.run, args=(stop,), daemon=True)
    thread.start()
    try:
        for _ in range(500):
            if contacts:
                break
            stop.wait(0.01)
    finally:
        stop.set()
        thread.join(5)
    assert controller.heartbeats
    assert 4.0 < contacts[0] <= 5.0  # the lease the leader granted, from when it was sent
    controller.forget = True  # a heartbeat that is not acknowledged renews nothing
    before, seen = lease.left(), len(contacts)
    with pytest.raises(NotFound):
        membership.heartbeat()
    assert lease.left() <= before and len(contacts) == seen
