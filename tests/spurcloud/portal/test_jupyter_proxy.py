"""A session's JupyterLab through the portal (spurcloud/portal/jupyter_proxy.py), over the
whole chain of real pieces: the web app (Django's ASGI handler, the Channels stack), a
real controller minting the service token, a real `spurd` whose proxy checks it, and a
sandboxed session job serving HTTP and a websocket echo on its Unix socket
(tests/fixtures/session_service.py, standing in for JupyterLab, which is not installed)."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core.cache import cache
from django.test import AsyncClient, Client

from scheduler.rpc import terminal_tokens
from spurcloud.asgi import application
from spurcloud.jobs.controller import controller_client
from spurcloud.jobs.services import record_job_event, submit_job
from spurcloud.portal import jupyter_proxy
from spurcloud.portal.session_activity import last_session_activity
from spurcloud.portal.sessions import session_templates
from spurcloud.tenants.models import Membership
from tests.agents.spurd import Courier, reachable_dir, start_agent
from tests.fixtures.processes import Processes, wait_until
from tests.fixtures.session_service import SERVICE
from tests.spurcloud.conftest import event
from tests.spurcloud.portal.conftest import HTMX, ROLES, RUNNERS, browser
from tests.spurcloud.websocket import WebsocketClient

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

TEMPLATE = {
    "key": "fake-lab",
    "title": "Fake Lab",
    "service": f"""python3 - --sock "$SPUR_SESSION_SOCKET" <<'PY'\n{SERVICE}\nPY\n""",
    "web": "Fake Lab",
}
ORIGIN = "http://testserver"


@pytest.fixture(autouse=True)
def no_grants_kept() -> None:
    jupyter_proxy.grants.held.clear()  # job ids start again at 1 with each controller


@pytest.fixture
def node(controller: Any, settings: Any, tmp_path: Any) -> Iterator[Courier]:
    """A real agent registered with the controller, and the courier
    that carries the controller's launches to it as a worker would."""
    settings.SPUR_CONTROLLER_URLS = [controller.url]
    settings.SPUR_CLUSTER_TOKEN = controller.token
    settings.SPUR_SESSION_TEMPLATES = [TEMPLATE]
    procs = Processes(tmp_path / "agent-logs")
    root = reachable_dir()
    try:
        start_agent(
            tmp_path,
            procs,
            name="node01",
            token=controller.token,
            controllers=[controller.url],
            work_root=root / "work",
            args=("--kill-jobs-on-exit",),
        )
        yield Courier(tmp_path / "broker", controller.token)
    finally:
        procs.stop_all()
        shutil.rmtree(root, ignore_errors=True)


def _launch(people: dict[str, Any], who: str = "member", key: str = "fake-lab", **more: Any) -> int:
    user = people[who]
    membership = Membership.objects.get(user=user)
    spec = {
        "script": session_templates()[key].script(30),
        "gpus": 1,
        "qos": "interactive",
        "comment": f"spur-session:{key}",
        "time_limit_min": 30,
        **more,
    }
    return int(submit_job(organization=membership.organization, user=user, spec=spec)["job_id"])


def _serving(node: Courier, people: dict[str, Any], who: str = "member") -> int:
    job_id = _launch(people, who)
    node.deliver(job_id)
    owner = people[who]
    wait_until(
        lambda: _get(owner, f"/sessions/{job_id}/jupyter/lab")[0].status_code == 200,
        timeout=30,
        what="the session's service through the proxy",
    )
    return job_id


def _get(
    user: Any | None,
    path: str,
    method: str = "get",
    cookies: dict[str, str] | None = None,
    **kw: Any,
) -> tuple[Any, bytes]:
    client = AsyncClient()
    if user is not None:
        client.force_login(user)
    for name, value in (cookies or {}).items():
        client.cookies[name] = value

    async def fetch() -> tuple[Any, bytes]:
        response = await getattr(client, method)(path, **kw)
        if not response.streaming:
            return response, response.content
        return response, b"".join([chunk async for chunk in response.streaming_content])

    return async_to_sync(fetch)()


# -- HTTP --------------------------------------------------------------------------------


@pytest.mark.parametrize("who", RUNNERS)
def test_the_sessions_own_user_reaches_the_service(
    who: str, people: dict[str, Any], node: Courier
) -> None:
    job_id = _serving(node, people, who=who)
    response, body = _get(
        people[who],
        f"/sessions/{job_id}/jupyter/api/contents/a%20b.ipynb?content=1",
        cookies={"_xsrf": "2|abc", "spur_tz": "Europe/Paris", "csrftoken": "c"},
        headers={"Authorization": "Bearer t"},
    )
    assert response.status_code == 200, body
    said = json.loads(body)
    assert said["path"] == f"/sessions/{job_id}/jupyter/api/contents/a b.ipynb"
    assert said["query"] == "content=1"
    headers = said["headers"]
    # The portal's cookies (its session, its CSRF token, the time zone) never reach it.
    assert headers["cookie"] == "_xsrf=2|abc"
    assert "authorization" not in headers and "x-spur-service-token" not in headers
    assert headers["host"] == "testserver"


def test_a_post_from_the_portal_goes_through_with_its_body(
    people: dict[str, Any], node: Courier
) -> None:
    job_id = _serving(node, people)
    path = f"/sessions/{job_id}/jupyter/api/sessions"
    response, body = _get(
        people["member"],
        path,
        "post",
        data=b'{"name": "n"}',
        content_type="application/json",
        headers={"Origin": ORIGIN, "X-XSRFToken": "abc"},
    )
    assert response.status_code == 200
    said = json.loads(body)
    assert (said["method"], said["body"]) == ("POST", '{"name": "n"}')
    assert said["headers"]["x-xsrftoken"] == "abc"
    for origin in ({}, {"Origin": "http://evil.example"}):
        refused, _ = _get(
            people["member"], path, "post", data=b"{}", content_type="text/plain", headers=origin
        )
        assert refused.status_code == 403


def test_the_services_cookies_stay_under_its_prefix_and_never_replace_the_portals(
    people: dict[str, Any], node: Courier
) -> None:
    job_id = _serving(node, people)
    response, _ = _get(people["member"], f"/sessions/{job_id}/jupyter/cookies")
    assert response.status_code == 200
    # The portal may set its own session cookie on the way out; never the service's.
    planted = response.cookies.get("sessionid")
    assert planted is None or (planted.value != "planted" and planted["path"] == "/")
    assert response.cookies["_xsrf"].value == "abc"
    assert response.cookies["_xsrf"]["path"] == f"/sessions/{job_id}/jupyter/"
    assert "Keep-Alive" not in response


def test_a_big_answer_streams_through_whole(people: dict[str, Any], node: Courier) -> None:
    job_id = _serving(node, people)
    response, body = _get(people["member"], f"/sessions/{job_id}/jupyter/files/big")
    assert response.streaming and body == b"x" * (1024 * 1024)


def test_billing_outsiders_and_strangers_are_refused(people: dict[str, Any], node: Courier) -> None:
    job_id = _serving(node, people)
    path = f"/sessions/{job_id}/jupyter/lab"
    assert _get(people["billing"], path)[0].status_code == 403
    assert _get(people["outsider"], path)[0].status_code == 404
    anonymous, _ = _get(None, path)
    assert anonymous.status_code == 302 and "/accounts/login/" in anonymous["Location"]


def test_nobody_else_reaches_the_service_not_even_an_owner(
    people: dict[str, Any], node: Courier
) -> None:
    """The service's pages run the session's code in the portal's origin: an owner who
    opened a member's JupyterLab would run, as the owner, what the member planted."""
    job_id = _serving(node, people, who="admin")
    for other in ("member", "owner"):
        response, body = _get(people[other], f"/sessions/{job_id}/jupyter/lab")
        assert response.status_code == 403, body


def test_a_session_without_a_web_service_or_not_running_has_none(
    people: dict[str, Any], node: Courier
) -> None:
    shell = _launch(people, key="shell")
    assert _get(people["member"], f"/sessions/{shell}/jupyter/lab")[0].status_code == 404
    pending = _launch(people, hold=True)
    response, body = _get(people["member"], f"/sessions/{pending}/jupyter/lab")
    assert response.status_code == 503 and b"not running" in body


@pytest.mark.parametrize("rest", ["%2e%2e/%2e%2e/v1/jobs", "a/%2E/b", "a%5Cb", "a%00b"])
def test_dot_segments_and_odd_characters_are_refused(
    rest: str, people: dict[str, Any], node: Courier
) -> None:
    job_id = _serving(node, people)
    assert _get(people["member"], f"/sessions/{job_id}/jupyter/{rest}")[0].status_code == 400


@pytest.mark.parametrize("who", ROLES)
def test_the_session_page_links_to_its_jupyterlab_for_those_it_lets_in(
    who: str, people: dict[str, Any], node: Courier
) -> None:
    job_id = _serving(node, people)
    record_job_event(event=event(controller_client().job(job_id)))  # as a worker mirrors it
    page = browser(people[who]).get(f"/sessions/{job_id}/status", headers=HTMX).content.decode()
    assert 'data-phase="running"' in page
    assert (f'href="/sessions/{job_id}/jupyter/lab"' in page) == (who == "member")
    assert ("Open Fake Lab" in page) == (who == "member")


# -- websockets --------------------------------------------------------------------------


def _socket(user: Any | None, path: str, subprotocols: list[str]) -> WebsocketClient:
    headers = [(b"origin", b"http://localhost"), (b"host", b"localhost")]
    if user is not None:
        client = Client()
        client.force_login(user)
        session = client.cookies["sessionid"].value
        headers.append((b"cookie", f"sessionid={session}; _xsrf=2|abc".encode()))
    socket = WebsocketClient(application, path, headers=headers)
    socket.scope["subprotocols"] = subprotocols
    socket.scope["query_string"] = b"session_id=s1"
    return socket


@pytest.mark.parametrize("who", RUNNERS)
def test_a_websocket_echoes_through_the_whole_chain(
    who: str, people: dict[str, Any], node: Courier
) -> None:
    job_id = _serving(node, people, who=who)
    path = f"/sessions/{job_id}/jupyter/api/kernels/k1/channels"
    socket = _socket(people[who], path, ["v1.kernel.websocket.jupyter.org"])

    async def scenario() -> None:
        accepted, subprotocol = await socket.connect(timeout=15)
        assert accepted and subprotocol == "v1.kernel.websocket.jupyter.org"
        hello = json.loads((await socket.receive_output(10))["text"])
        assert hello["path"] == f"{path}?session_id=s1"
        assert hello["cookie"] == "_xsrf=2|abc"  # not the portal's session
        await socket.send_input({"type": "websocket.receive", "text": "hello"})
        assert (await socket.receive_output(10))["text"] == "echo:hello"
        await socket.send_input({"type": "websocket.receive", "bytes": b"\x00bin"})
        assert (await socket.receive_output(10))["bytes"] == b"\x00bin"
        await socket.disconnect()

    async_to_sync(scenario)()


@pytest.mark.parametrize(("who", "code"), [(None, 4401), ("billing", 4403), ("outsider", 4404)])
def test_a_websocket_is_refused_to_who_may_not(
    who: str | None, code: int, people: dict[str, Any], node: Courier
) -> None:
    job_id = _serving(node, people)
    path = f"/sessions/{job_id}/jupyter/api/events/subscribe"
    socket = _socket(people[who] if who else None, path, [])

    async def scenario() -> None:
        assert await socket.connect(timeout=15) == (False, code)

    async_to_sync(scenario)()


# -- the cookie rules themselves -------------------------------------------------------


def test_the_portals_cookies_are_kept_from_the_service_both_ways() -> None:
    sent = "sessionid=s; csrftoken=c; spur_tz=UTC; messages=m; _xsrf=2|x; username-h=u"
    assert jupyter_proxy.service_cookies(sent) == "_xsrf=2|x; username-h=u"
    kept = jupyter_proxy.kept_cookies(
        [
            "sessionid=planted; Path=/",
            "csrftoken=planted",
            "_xsrf=abc; Path=/; Domain=example.com",
            "username-h=u; Path=/sessions/3/jupyter/lab",
        ],
        "/sessions/3/jupyter/",
    )
    assert sorted(kept) == ["_xsrf", "username-h"]
    assert (kept["_xsrf"]["path"], kept["_xsrf"]["domain"]) == ("/sessions/3/jupyter/", "")
    assert kept["username-h"]["path"] == "/sessions/3/jupyter/lab"


def test_a_websocket_into_someone_elses_or_a_pending_session_is_refused(
    people: dict[str, Any], node: Courier
) -> None:
    admins = _serving(node, people, who="admin")
    pending = _launch(people, hold=True)
    others = _socket(people["member"], f"/sessions/{admins}/jupyter/api/events/subscribe", [])
    owner = _socket(people["owner"], f"/sessions/{admins}/jupyter/api/events/subscribe", [])
    waiting = _socket(people["member"], f"/sessions/{pending}/jupyter/api/events/subscribe", [])
    odd = _socket(people["admin"], f"/sessions/{admins}/jupyter/a/%2e%2e/b", [])
    odd.scope["path"] = f"/sessions/{admins}/jupyter/a/../b"  # as the server decodes it

    async def scenario() -> None:
        assert await others.connect(timeout=15) == (False, 4403)
        assert await owner.connect(timeout=15) == (False, 4403)
        assert await waiting.connect(timeout=15) == (False, 4503)
        assert await odd.connect(timeout=15) == (False, 4400)

    async_to_sync(scenario)()


def test_the_proxy_notes_the_session_in_use_once_in_a_while() -> None:
    """What idle culling counts from: the first request through the proxy notes the
    session used; the next ones within NOTE_EVERY_S do not write the cache again."""
    jupyter_proxy._noted.clear()
    cache.delete_many([f"spur:session-activity:{n}" for n in (7001, 7002)])
    jupyter_proxy.session_used(7001)
    first = last_session_activity(7001)
    assert first is not None
    cache.delete("spur:session-activity:7001")
    jupyter_proxy.session_used(7001)  # within the interval: not written again
    assert last_session_activity(7001) is None
    jupyter_proxy.session_used(7002)  # another session is its own
    assert last_session_activity(7002) is not None


def test_an_expired_service_token_is_refused_by_the_agent_and_a_fresh_one_asked(
    people: dict[str, Any], node: Courier, tmp_path: Any
) -> None:
    """The web keeps a grant until shortly before the expiry it was told; a clock that
    disagrees with the controller's, or a grant kept too long, reaches the agent expired.
    The agent refuses it, and the proxy asks the controller again, once, for HTTP and
    websockets alike."""
    job_id = _serving(node, people)
    member = people["member"]
    membership = Membership.objects.get(user=member)
    key = (membership.organization_id, member.pk, job_id)
    credential = bytes.fromhex((tmp_path / "spool-node01" / "credential").read_text().strip())

    def plant_expired() -> str:
        held = jupyter_proxy.grants.get(key)
        assert held is not None  # the grant the proxy used so far
        token = terminal_tokens.mint(
            credential, job_id=job_id, attempt=1, node="node01", tenant="acme", user="max",
            now=time.time() - terminal_tokens.TTL_S - 1, kind=terminal_tokens.SERVICE,
        )  # fmt: skip
        jupyter_proxy.grants.put(key, {**held, "token": token})
        return token

    expired = plant_expired()
    response, _ = _get(member, f"/sessions/{job_id}/jupyter/lab")
    assert response.status_code == 200
    fresh = jupyter_proxy.grants.get(key)
    assert fresh is not None and fresh["token"] != expired

    expired = plant_expired()
    path = f"/sessions/{job_id}/jupyter/api/kernels/k1/channels"
    socket = _socket(member, path, ["v1.kernel.websocket.jupyter.org"])

    async def scenario() -> None:
        accepted, _ = await socket.connect(timeout=15)
        assert accepted
        await socket.receive_output(10)  # the service's hello
        await socket.send_input({"type": "websocket.receive", "text": "hello"})
        assert (await socket.receive_output(10))["text"] == "echo:hello"
        await socket.disconnect()

    async_to_sync(scenario)()
    fresh = jupyter_proxy.grants.get(key)
    assert fresh is not None and fresh["token"] != expired
