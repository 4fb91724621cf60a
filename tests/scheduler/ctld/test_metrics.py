"""`GET /metrics` on a real `spurctld`: Prometheus text with the Raft, scheduling, job
and node figures, served without the cluster token and holding counts only."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.controller import RunningController
from tests.fixtures.processes import wait_until
from tests.scheduler.core.factories import gpu_node, spec


def scrape(
    controller: RunningController,
) -> tuple[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    response = httpx.get(controller.url + "/metrics", timeout=10)  # no token
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }
    return response.text, samples


def test_metrics_show_raft_scheduling_jobs_and_nodes(controller: RunningController) -> None:
    with controller.client() as client:
        client.register_node(gpu_node("n1", gpus=1).to_dict())
        client.register_node(gpu_node("n2", gpus=1).to_dict())
        for i in range(3):
            client.submit(
                spec(
                    name=f"secret-job-{i}", tenant="tenant-secret", user="bob-secret", gpus=1
                ).to_dict()
            )
        wait_until(
            lambda: sorted(j["state"] for j in client.jobs()) == ["PENDING", "RUNNING", "RUNNING"],
            timeout=15,
            what="two jobs placed",
        )

    def settled() -> bool:
        _, s = scrape(controller)
        return (
            s[("spur_scheduling_passes_total", ())] >= 1
            and s[("spur_raft_apply_lag_entries", ())] == 0
        )

    wait_until(settled, timeout=10, what="a pass and no apply lag")
    text, s = scrape(controller)
    assert s[("spur_raft_leader", ())] == 1
    assert s[("spur_raft_term", ())] >= 1
    assert s[("spur_raft_commit_index", ())] >= 6  # 2 registrations, 3 submits, a pass
    assert s[("spur_raft_members", ())] == 1
    assert s[("spur_jobs_pending", ())] == 1
    assert s[("spur_jobs_running", ())] == 2
    assert s[("spur_jobs", (("state", "RUNNING"),))] == 2
    assert s[("spur_jobs", (("state", "COMPLETED"),))] == 0
    assert s[("spur_nodes", (("state", "alloc"),))] == 2
    assert s[("spur_nodes", (("state", "idle"),))] == 0
    assert s[("spur_scheduling_last_pass_seconds", ())] > 0
    assert s[("spur_scheduling_pass_seconds_total", ())] > 0
    # Counts only: no tenant, user, job or node name.
    for secret in ("tenant-secret", "bob-secret", "secret-job", "n1", "n2"):
        assert secret not in text


def test_the_raft_route_needs_the_token_and_metrics_do_not(controller: RunningController) -> None:
    assert httpx.get(controller.url + "/v1/raft", timeout=10).status_code == 401
    with controller.client() as client:
        info = client.call("GET", "/v1/raft")["replica"]
    assert info["role"] == "leader" and info["members"] == [info["self"]]
    assert info["commit_index"] == info["last_applied"] == info["log_last_index"]
