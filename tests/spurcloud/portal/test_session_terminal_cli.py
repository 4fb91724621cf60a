"""The Slurm commands in a session's web terminal (terminal_api_token.py, agents/slurm_cli.py),
through the real ASGI application, a real controller, a real spurd running the session
and the web API on a live server: `squeue` lists the session, `sbatch` submits a job for
the member's organisation, with a token of the member's for this connection only (scopes
read and jobs, named for the session, expiring at its end), that can do no operator's
thing even for a staff user, and that is revoked when the terminal closes."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async
from django.test import Client
from django.utils import timezone

from spurcloud.jobs.models import JobRecord
from spurcloud.portal.terminal_api_token import api_url_for_nodes, token_expiry, token_name
from spurcloud.tenants.models import ApiToken, AuditEvent
from spurcloud.tenants.tokens import hash_secret
from tests.fixtures.processes import wait_until
from tests.spurcloud.portal import test_session_terminal_socket as terminal_tests
from tests.spurcloud.portal.test_session_terminal_socket import _read_until, _socket, _type, live

# The real agent's fixtures: a spurd running node01, and a session started on it.
node = terminal_tests.node
session = terminal_tests.session


def _api(secret: str, path: str = "/api/v1/jobs") -> int:
    return Client().get(path, headers={"Authorization": f"Bearer {secret}"}).status_code


@live
def test_squeue_and_sbatch_in_the_terminal_act_as_the_member_in_their_organisation(
    people: dict[str, Any], session: Callable[[str], int], live_server: Any, settings: Any
) -> None:
    settings.SPUR_NODE_API_URL = live_server.url
    job_id = session("member")
    socket = _socket(people["member"], job_id)
    seen: dict[str, bytes] = {}
    opened = timezone.now()

    async def scenario() -> None:
        assert (await socket.connect(timeout=20))[0]
        await _type(socket, b"squeue -h -o '<%i %u %j>'; echo $SPUR_TOKEN; echo fini''shed\n")
        seen["squeue"] = await _read_until(socket, b"finished")
        await _type(socket, b"sbatch --wrap true -J from-the-terminal; echo fini''shed\n")
        seen["sbatch"] = await _read_until(socket, b"finished")
        await socket.disconnect()

    async_to_sync(scenario)()
    member = people["member"].get_username()
    assert f"<{job_id} {member} ".encode() in seen["squeue"], seen["squeue"]
    submitted = re.search(rb"Submitted batch job (\d+)", seen["sbatch"])
    assert submitted is not None, seen["sbatch"]
    record = JobRecord.objects.get(job_id=int(submitted.group(1)))
    assert (record.organization, record.user, record.name) == (
        people["member"].memberships.get().organization,
        member,
        "from-the-terminal",
    )
    # sbatch exported the shell's environment, but never its token.
    environment = (record.spec or {}).get("environment") or {}
    assert environment.get("SLURM_JOB_ID") == str(job_id)  # the shell's, exported
    assert not {"SPUR_TOKEN", "SPUR_STEP_TOKEN"} & set(environment)
    # The token: the member's, for this session, read and jobs, until the session's end.
    secret = re.search(rb"(spur_[A-Za-z0-9_-]{43})\r\n", seen["squeue"])
    assert secret is not None, seen["squeue"]
    token = ApiToken.objects.get(token_hash=hash_secret(secret.group(1).decode()))
    assert (token.user, token.name, token.scopes) == (
        people["member"],
        token_name(job_id),
        "read jobs",
    )
    # Until the session's end: its time limit from its start where the record has seen it
    # (the controller's answer to the submission may already hold it: its pass can run
    # before the answer is read), else from the minting on (no worker mirrors the
    # controller's events here).
    started = JobRecord.objects.get(job_id=job_id).start_time
    assert token.expires_at is not None
    assert opened < token.expires_at <= (started or opened) + timedelta(minutes=30, seconds=30)
    # Revoked with the terminal's end: the API refuses it from then on.
    wait_until(
        lambda: ApiToken.objects.get(pk=token.pk).revoked_at is not None,
        timeout=10,
        what="the token's revocation",
    )
    assert _api(secret.group(1).decode()) == 401
    actions = AuditEvent.objects.filter(target=token.prefix).values_list("action", flat=True)
    assert set(actions) == {AuditEvent.Action.TOKEN_CREATED, AuditEvent.Action.TOKEN_REVOKED}


@live
def test_the_terminals_token_does_no_operators_thing_even_for_staff(
    people: dict[str, Any], session: Callable[[str], int], live_server: Any, settings: Any
) -> None:
    settings.SPUR_NODE_API_URL = live_server.url
    people["member"].is_staff = True
    people["member"].save()
    job_id = session("member")
    socket = _socket(people["member"], job_id)

    async def scenario() -> None:
        assert (await socket.connect(timeout=20))[0]
        await _type(socket, b"sbatch --nice=-5 --wrap true; echo fini''shed\n")
        seen = await _read_until(socket, b"finished")
        assert b"Submitted batch job" not in seen
        assert b"cluster operators (staff, with an admin-scoped token)" in seen, seen
        await socket.disconnect()

    async_to_sync(scenario)()


@live
def test_each_connection_has_its_own_token_and_none_is_given_in_someone_elses_session(
    people: dict[str, Any], session: Callable[[str], int], live_server: Any, settings: Any
) -> None:
    """Two tabs, two tokens; an owner in a member's session gets a shell without one (it
    runs as the member's job, among files any member can change)."""
    settings.SPUR_NODE_API_URL = live_server.url
    job_id = session("member")
    tabs = [_socket(people["member"], job_id), _socket(people["member"], job_id)]
    owners = _socket(people["owner"], job_id)

    async def scenario() -> None:
        for socket in (*tabs, owners):
            assert (await socket.connect(timeout=20))[0]
            await _type(socket, b"echo me=$SPUR_USER api=$SPUR_API_URL; echo fini''shed\n")
        member = people["member"].get_username()
        seen = await _read_until(tabs[1], b"finished")
        assert f"me={member} api={live_server.url}".encode() in seen, seen
        live_tokens = ApiToken.objects.filter(name=token_name(job_id), revoked_at=None)
        assert await sync_to_async(live_tokens.count)() == 2
        await _type(owners, b"squeue; echo ${SPUR_TOKEN-no''-token}\n")
        seen = await _read_until(owners, b"no-token")
        assert b"squeue: error: no Spur API configured" in seen, seen
        for socket in (*tabs, owners):
            await socket.disconnect()

    async_to_sync(scenario)()
    tokens = ApiToken.objects.filter(name=token_name(job_id))
    assert {t.user for t in tokens} == {people["member"]}
    wait_until(lambda: not tokens.filter(revoked_at=None).exists(), timeout=10, what="both revoked")


def test_the_token_expires_at_the_sessions_end_and_never_later_than_a_session_may_last(
    settings: Any,
) -> None:
    settings.SPUR_SESSION_MAX_MINUTES = 24 * 60
    now = timezone.now()
    started = now - timedelta(minutes=10)
    assert token_expiry(start=started, time_limit_min=30, now=now) == now + timedelta(minutes=20)
    # Not yet mirrored as started: from now.
    assert token_expiry(start=None, time_limit_min=30, now=now) == now + timedelta(minutes=30)
    # No limit, or a longer one than a session may have: the longest a session lasts.
    for limit in (None, 0, 10 * 24 * 60):
        assert token_expiry(start=started, time_limit_min=limit, now=now) == now + timedelta(days=1)
    # Past its limit, in the kill grace: briefly.
    assert token_expiry(start=now - timedelta(hours=2), time_limit_min=30, now=now) == (
        now + timedelta(minutes=1)
    )


def test_the_api_url_is_the_setting_else_the_one_the_browser_used_if_it_is_ours(
    settings: Any,
) -> None:
    settings.SPUR_NODE_API_URL = ""
    settings.ALLOWED_HOSTS = ["portal.example", "localhost"]

    def scope(host: bytes | None, scheme: str = "wss") -> dict[str, Any]:
        return {"scheme": scheme, "headers": [(b"host", host)] if host is not None else []}

    assert api_url_for_nodes(scope(b"portal.example")) == "https://portal.example"
    assert api_url_for_nodes(scope(b"localhost:8000", "ws")) == "http://localhost:8000"
    assert api_url_for_nodes(scope(b"evil.example")) is None  # a Host of someone else's
    assert api_url_for_nodes(scope(None)) is None
    settings.SPUR_NODE_API_URL = "http://10.0.0.1:8000/"
    assert api_url_for_nodes(scope(b"portal.example")) == "http://10.0.0.1:8000"
