"""The dashboard (GPU catalog, active jobs, recent activity, a first-run guide) and the
nodes page's units."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from spurcloud.jobs.services import submit_job
from spurcloud.portal import catalog
from spurcloud.portal.catalog import DashboardCatalog, GpuKind, gpu_catalog, kept_catalog
from spurcloud.portal.templatetags.jobs import mebibytes
from spurcloud.tenants.services import create_api_token
from tests.fixtures.processes import wait_until
from tests.spurcloud.conftest import Tenant
from tests.spurcloud.portal.conftest import EVERYONE, ROLES, browser, record


def _gpus(model: str, vendor: str, count: int, link: str, memory_mb: int) -> list[dict[str, Any]]:
    return [
        {
            "index": i,
            "vendor": vendor,
            "model": model,
            "memory_mb": memory_mb,
            "links": [[j, link] for j in range(count) if j != i],
        }
        for i in range(count)
    ]


def test_the_catalog_counts_free_gpus_of_each_kind_where_nodes_take_work() -> None:
    nodes = [
        {"name": "a1", "state": "mix", "gpus_in_use": [0, 3],
         "gpus": _gpus("mi300x", "amd", 4, "xgmi", 196608)},
        {"name": "a2", "state": "idle", "gpus_in_use": [],
         "gpus": _gpus("mi300x", "amd", 4, "xgmi", 196608)},
        {"name": "h1", "state": "drain", "gpus_in_use": [],
         "gpus": _gpus("h100", "nvidia", 2, "nvlink", 81920)},
        {"name": "h2", "state": "down", "gpus": _gpus("h100", "nvidia", 1, "pcie", 81920)},
        {"name": "cpu1", "state": "idle", "gpus": []},
    ]  # fmt: skip
    assert gpu_catalog(nodes) == [
        GpuKind("amd", "mi300x", 196608, "xGMI", free=6, total=8, nodes=2),
        GpuKind("nvidia", "h100", 81920, "NVLink", free=0, total=3, nodes=2),
    ]


@pytest.mark.parametrize(
    ("mb", "text"),
    [(2097152, "2 TiB"), (81920, "80 GiB"), (64000, "62.5 GiB"), (512, "512 MiB"), (0, "0 MiB")],
)
def test_sizes_are_shown_in_binary_units(mb: int, text: str) -> None:
    assert mebibytes(mb) == text


@pytest.mark.parametrize("who", EVERYONE)
def test_the_catalog_shows_each_gpu_model_free_now_of_total(
    who: str, people: dict[str, Any], live_controller: Any
) -> None:
    page = browser(people[who]).get("/").content.decode()
    assert "<strong>H100</strong>" in page and "<td>80 GiB</td>" in page
    assert "<td>1 / 1</td>" in page
    assert "127.0.0.1:9" not in page  # nothing of how to reach a node


def test_a_busy_gpu_is_not_free(acme: Tenant, live_controller: Any) -> None:
    job = submit_job(
        organization=acme.organization,
        user=acme.member,
        spec={"script": "#!/bin/sh\nsleep 600\n", "gpus": 1},
    )
    # Placed by the controller's next scheduling pass (up to pass_min_interval_s after
    # the node's registration's), not by the submission itself.
    with live_controller.client() as client:
        wait_until(
            lambda: client.job(job["job_id"], tenant=job["tenant"])["state"] == "RUNNING",
            what="the job placed",
        )
    page = browser(acme.owner).get("/").content.decode()
    assert "<td>0 / 1</td>" in page


def test_the_dashboard_says_when_the_scheduler_is_unreachable(people: dict[str, Any]) -> None:
    response = browser(people["member"]).get("/")
    assert response.status_code == 200
    assert b"The scheduler is unreachable" in response.content


@pytest.mark.parametrize("who", ROLES)
def test_a_new_organisation_gets_the_first_run_guide_until_its_first_job(
    who: str, people: dict[str, Any]
) -> None:
    client = browser(people[who])
    page = client.get("/").content.decode()
    assert "run your first job" in page
    assert 'href="/tokens/"' in page and 'href="/launch/"' in page
    assert "sbatch --gres=gpu:1" in page
    assert "export SPUR_API_URL=http://testserver\n" in page
    record(7)
    assert "run your first job" not in client.get("/").content.decode()


def test_active_jobs_only_and_the_organisations_only(people: dict[str, Any]) -> None:
    record(1, name="waiting", state="PENDING")
    record(2, name="busy", state="RUNNING")
    record(3, name="over", state="COMPLETED")
    record(4, tenant="globex", user="oscar", name="theirs", state="RUNNING")
    page = browser(people["member"]).get("/").content.decode()
    assert 'data-job-id="1"' in page and 'data-job-id="2"' in page
    assert 'data-job-id="3"' not in page and "theirs" not in page


def test_members_see_their_own_activity_owners_and_admins_everyones(
    acme: Tenant, people: dict[str, Any]
) -> None:
    create_api_token(user=acme.member, organization=acme.organization, name="laptop")
    create_api_token(user=acme.owner, organization=acme.organization, name="ci")
    own = browser(people["member"]).get("/").content.decode()
    everyone = browser(people["admin"]).get("/").content.decode()
    outsider = browser(people["outsider"]).get("/").content.decode()
    assert own.count("API token created") == 1
    assert everyone.count("API token created") == 2
    assert "API token created" not in outsider


def test_the_nodes_page_shows_gpu_models_and_memory_in_readable_units(
    people: dict[str, Any], live_controller: Any
) -> None:
    page = browser(people["member"]).get("/nodes/").content.decode()
    assert "h100×1 (80 GiB each)" in page
    assert "62.5 GiB" in page and "64000" not in page


def test_a_controller_that_refuses_this_site_is_said_plainly(
    people: dict[str, Any], live_controller: Any, settings: Any
) -> None:
    settings.SPUR_CLUSTER_TOKEN = "not-the-cluster-token"
    for path in ("/", "/nodes/", "/launch/"):
        response = browser(people["member"]).get(path)
        assert response.status_code == 200, path
        assert b"The scheduler answered with an error" in response.content, path


def test_the_catalog_is_read_once_a_second_for_everyone(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[str] = []

    def read(answer: str, seconds: float = 0.05) -> DashboardCatalog:
        reads.append(answer)
        time.sleep(seconds)  # a controller's answer takes a while
        return DashboardCatalog(kinds=[], prices={}, error=answer)

    # Nothing kept yet: the others wait for the one read.
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: kept_catalog("a", lambda: read("a")), range(8)))
    assert reads == ["a"] and {a.error for a in answers} == {"a"}
    # Another controller (or token): read.
    assert kept_catalog("b", lambda: read("b")).error == "b"
    # A second later one reads again; meanwhile the others take the answer before it.
    monkeypatch.setattr(catalog, "KEPT_S", 0.05)
    kept_catalog("c", lambda: read("c1"))
    time.sleep(0.1)
    monkeypatch.setattr(catalog, "KEPT_S", 10.0)
    with ThreadPoolExecutor(2) as pool:
        slow = pool.submit(kept_catalog, "c", lambda: read("c2", seconds=0.5))
        time.sleep(0.1)
        assert kept_catalog("c", lambda: read("never")).error == "c1"
        assert slow.result().error == "c2"
    assert kept_catalog("c", lambda: read("never")).error == "c2"
    assert reads == ["a", "b", "c1", "c2"]


def test_a_dashboard_reads_the_users_memberships_once(people: dict[str, Any]) -> None:
    client = browser(people["member"])
    record(1, state="RUNNING")
    client.get("/")  # the session's first read
    for path in ("/", "/jobs/", "/jobs/1/"):
        with CaptureQueriesContext(connection) as queries:
            assert client.get(path).status_code == 200
        memberships = [q for q in queries if "tenants_membership" in q["sql"]]
        assert len(memberships) == 1, path


def test_the_dashboard_costs_the_same_queries_for_a_few_jobs_or_many(
    people: dict[str, Any],
) -> None:
    client = browser(people["member"])
    for job_id in range(1, 4):
        record(job_id, state="RUNNING")
    client.get("/")
    with CaptureQueriesContext(connection) as few:
        client.get("/")
    for job_id in range(4, 60):
        record(job_id, state="RUNNING" if job_id % 2 else "COMPLETED")
    with CaptureQueriesContext(connection) as many:
        client.get("/")
    assert len(many) == len(few)
