"""The web terminal's agent end (agents/terminal.py), served by uvicorn over a real launcher:
a token that is not this node's for a job it runs is refused with 4401 before any shell
starts; a good one gets a shell in the job's sandbox, as the job's identity, with the
job's environment, whose window size follows resize messages, and which dies with the
socket."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from agents import slurm_cli, terminal
from agents.api import create_app
from agents.credentials import NodeCredential
from agents.identity import Identity
from agents.launcher import Launcher, LaunchRequest
from scheduler.rpc import signatures, terminal_tokens
from spurcloud.tenants.tokens import generate_secret
from tests.agents.conftest import OTHER_TENANT, TENANT, make_payload
from tests.fixtures.processes import wait_until
from tests.fixtures.served import served_in_thread

SIGNING_KEY = b"the controllers' key"
TOKEN = "cluster-token"
JOB = 41


@pytest.fixture
def credential(tmp_path: Path) -> NodeCredential:
    held = NodeCredential(tmp_path / "credential", "sim01")
    held.store(signatures.node_key(SIGNING_KEY, "sim01").hex())
    return held


@pytest.fixture
def agent(launcher: Launcher, credential: NodeCredential) -> Iterator[str]:
    """The agent's app under uvicorn (websockets need a server), its ws:// base URL."""
    app = create_app(launcher=launcher, token=TOKEN, credential=credential)
    with served_in_thread(app) as url:
        yield "ws://" + url.removeprefix("http://")


@pytest.fixture
def job(launcher: Launcher, tmp_path: Path) -> int:
    """A running session-like job: its script sleeps."""
    payload = make_payload(JOB, "#!/bin/sh\nexec sleep 600\n", workdir="")
    payload["job"]["spec"]["environment"] = {"SPUR_SESSION_MARK": "from the job"}
    launcher.launch(LaunchRequest.from_payload(payload))
    wait_until(lambda: launcher.running() != [], timeout=20, what="the job")
    return JOB


def token(
    *,
    job_id: int = JOB,
    attempt: int = 1,
    node: str = "sim01",
    tenant: str = TENANT,
    key: bytes = SIGNING_KEY,
    now: float | None = None,
) -> str:
    return terminal_tokens.mint(
        signatures.node_key(key, node),
        job_id=job_id,
        attempt=attempt,
        node=node,
        tenant=tenant,
        user="alice",
        now=time.time() if now is None else now,
    )


def open_terminal(
    base: str, value: str | None, job_id: int = JOB, extra: dict[str, str] | None = None
) -> ClientConnection:
    headers = {"Authorization": f"Bearer {value}"} if value is not None else {}
    headers.update(extra or {})
    return connect(f"{base}/v1/jobs/{job_id}/terminal", additional_headers=headers, open_timeout=10)


def read_until(ws: ClientConnection, wanted: str, timeout: float = 20, times: int = 1) -> str:
    """The output up to the `times`-th `wanted` (a typed line is echoed: markers are
    written `rea''dy` so that only what the shell says matches)."""
    seen = b""
    deadline = time.monotonic() + timeout
    while seen.count(wanted.encode()) < times:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{wanted!r} never came; the terminal said {seen!r}")
        try:
            message = ws.recv(timeout=left)
        except TimeoutError:
            raise TimeoutError(f"{wanted!r} never came; the terminal said {seen!r}") from None
        assert isinstance(message, bytes), message
        seen += message
    return seen.decode(errors="replace")


def closed_with(ws: ClientConnection) -> tuple[int | None, str]:
    with pytest.raises(ConnectionClosed) as raised:
        ws.recv(timeout=10)
    rcvd = raised.value.rcvd
    return (rcvd.code, rcvd.reason) if rcvd is not None else (None, "")


def marked(mark: str) -> list[int]:
    """Pids whose command line holds `mark`."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if mark.encode() in Path(f"/proc/{name}/cmdline").read_bytes():
                    found.append(int(name))
            except OSError:
                continue
    return found


def test_a_shell_runs_in_the_job_as_its_identity_with_its_environment(
    agent: str, job: int, identity: Identity
) -> None:
    with open_terminal(agent, token()) as ws:
        ws.send(b"echo id=$(id -u) job=$SLURM_JOB_ID mark=$SPUR_SESSION_MARK\n")
        seen = read_until(ws, "mark=from the job")
        assert f"id={identity.uid} job={JOB}" in seen
        # Typed before the next prompt, a line is echoed by the terminal and again by
        # readline once it starts: only what the shell says is counted.
        ws.send(b"echo he''llo\n")
        seen = read_until(ws, "hello")
        assert "he''llo" in seen  # typed (echoed), then said


def test_resize_messages_set_the_window_size_the_shell_sees(agent: str, job: int) -> None:
    with open_terminal(agent, token()) as ws:
        ws.send(json.dumps({"resize": [132, 43]}))
        ws.send(b"stty size\n")
        read_until(ws, "43 132")
        ws.send(json.dumps({"resize": [0, 43]}))  # not a size: ignored
        ws.send(json.dumps({"resize": [90, 20]}))
        ws.send(b"stty size\n")
        read_until(ws, "20 90")


@pytest.mark.parametrize(
    "case",
    ["none", "garbage", "forged", "expired", "another job", "another node", "another tenant",
     "another attempt"],
)  # fmt: skip
def test_a_bad_token_is_refused_before_any_shell_starts(
    case: str, agent: str, job: int, launcher: Launcher
) -> None:
    value: str | None = {
        "none": None,
        "garbage": "spur-term.x.y",
        "forged": token(key=b"not the controllers' key"),
        "expired": token(now=time.time() - terminal_tokens.TTL_S - 5),
        "another job": token(job_id=JOB + 1),
        "another node": token(node="sim02"),
        "another tenant": token(tenant=OTHER_TENANT),
        "another attempt": token(attempt=2),
    }[case]
    with open_terminal(agent, value) as ws:
        code, _ = closed_with(ws)
    assert code == terminal.CLOSE_UNAUTHORIZED
    assert launcher.steps.running() == []


def test_a_token_for_one_job_opens_no_terminal_in_another(
    agent: str, job: int, launcher: Launcher
) -> None:
    with open_terminal(agent, token(), job_id=JOB + 1) as ws:
        code, reason = closed_with(ws)
    assert (code, reason) == (terminal.CLOSE_UNAUTHORIZED, "this terminal token is for another job")


def test_closing_the_socket_kills_the_shell_and_what_it_started(
    agent: str, job: int, launcher: Launcher
) -> None:
    mark = "4242.5"
    with open_terminal(agent, token()) as ws:
        ws.send(f"sleep {mark} &\necho star''ted\n".encode())
        read_until(ws, "started")
        # The shell may print before its background child has exec'd sleep.
        wait_until(lambda: marked(f"sleep\0{mark}"), timeout=30, what="the sleep's start")
    wait_until(lambda: not marked(f"sleep\0{mark}"), timeout=30, what="the shell's end")
    wait_until(lambda: launcher.steps.running() == [], timeout=30, what="the run's end")
    assert launcher.running() != []  # the job itself runs on


def test_exiting_the_shell_closes_the_socket(agent: str, job: int) -> None:
    with open_terminal(agent, token()) as ws:
        ws.send(b"exit\n")
        code, _ = closed_with_output(ws)
    assert code == terminal.CLOSE_ENDED


def closed_with_output(ws: ClientConnection) -> tuple[int | None, str]:
    """The close, after whatever output came before it."""
    while True:
        try:
            ws.recv(timeout=10)
        except ConnectionClosed as exc:
            rcvd = exc.rcvd
            return (rcvd.code, rcvd.reason) if rcvd is not None else (None, "")


def test_the_jobs_end_ends_its_terminals(agent: str, job: int, launcher: Launcher) -> None:
    with open_terminal(agent, token()) as ws:
        ws.send(b"echo rea''dy\n")
        read_until(ws, "ready")
        launcher.signal(JOB, 1, 9)
        code, _ = closed_with_output(ws)
    assert code == terminal.CLOSE_ENDED


def test_a_job_has_a_few_terminals_at_most(
    agent: str, job: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(terminal, "MAX_TERMINALS_PER_JOB", 2)
    with open_terminal(agent, token()) as one, open_terminal(agent, token()) as two:
        for ws in (one, two):
            ws.send(b"echo u''p\n")
            read_until(ws, "up")
        with open_terminal(agent, token()) as three:
            assert closed_with(three)[0] == terminal.CLOSE_TOO_MANY

    def room_again() -> bool:  # once the agent has seen the others close
        with open_terminal(agent, token()) as again:
            again.send(b"echo u''p\n")
            return "up" in read_until(again, "up", timeout=5)

    wait_until(room_again, timeout=30, what="a terminal once the others closed")


def test_a_frame_too_large_closes_the_terminal(agent: str, job: int) -> None:
    with open_terminal(agent, token()) as ws:
        ws.send(b"x" * (terminal.MAX_FRAME + 1))
        assert closed_with_output(ws)[0] == 1009


def test_control_c_interrupts_the_foreground_command(agent: str, job: int) -> None:
    with open_terminal(agent, token()) as ws:
        ws.send(b"sleep 300; echo sle''pt\n")
        read_until(ws, "sleep 300")
        ws.send(b"\x03")
        ws.send(b"echo interr''upted\n")
        seen = read_until(ws, "interrupted")
        assert "slept" not in seen


API_TOKEN = generate_secret()


def test_the_slurm_commands_and_the_webs_api_token_are_in_the_shell_only(
    agent: str, job: int, launcher: Launcher, credential: NodeCredential
) -> None:
    """The web's token and URL are the shell's (`SPUR_TOKEN`, `SPUR_API_URL`, and the
    terminal token's user as `SPUR_USER`), not the job's; the Slurm commands are on its
    PATH and run with the sandbox's own python3 (the host's, no platform package)."""
    launcher.credential = credential  # a registered node's: its sandboxes get the tools
    headers = {"X-Spur-Api-Token": API_TOKEN, "X-Spur-Api-Url": "http://web.example:8000/"}
    with open_terminal(agent, token(), extra=headers) as ws:
        ws.send(b'echo "t=$SPUR_TOKEN u=$SPUR_API_URL me=$SPUR_USER" end\n')
        seen = read_until(ws, "me=alice end")
        assert f"t={API_TOKEN} u=http://web.example:8000 me=alice end" in seen
        # Nor on any command line on the host (anyone's to read): bubblewrap read the
        # environment from a descriptor.
        request = launcher.job_request(JOB, 1)
        assert request is not None
        assert marked(API_TOKEN) == [] and marked(launcher.step_token(request)) == []
        ws.send(b"for c in " + " ".join(slurm_cli.COMMANDS).encode() + b"; do command -v $c; done;"
                b" sinfo --version; echo fini''shed\n")  # fmt: skip
        seen = read_until(ws, "finished")
        for command in slurm_cli.COMMANDS:
            assert f"/run/spur/bin/{command}\r\n" in seen, seen
        assert "slurm 22.05.8" in seen
        # No Python package of the platform's is importable but from the bundle.
        ws.send(b"python3 -c 'import scheduler' 2>&1 | tail -1; echo fini''shed\n")
        assert "No module named 'scheduler'" in read_until(ws, "finished")
    assert "SPUR_TOKEN" not in request.spec.env
    with open_terminal(agent, token()) as ws:  # another terminal, no token: none
        ws.send(b'echo "t=${SPUR_TOKEN-none}" end\n')
        assert "t=none end" in read_until(ws, "t=none end")


@pytest.mark.parametrize(
    "headers",
    [
        {"X-Spur-Api-Token": "not-a-token"},
        {"X-Spur-Api-Token": "spur_short"},
        {"X-Spur-Api-Token": "spur_" + "a" * 201},
        {"X-Spur-Api-Token": API_TOKEN[:-1] + "$"},
        {"X-Spur-Api-Token": API_TOKEN + " ; rm -rf /"},
        {"X-Spur-Api-Url": "http://web.example"},  # a URL without a token
        {"X-Spur-Api-Token": API_TOKEN, "X-Spur-Api-Url": "file:///etc/passwd"},
        {"X-Spur-Api-Token": API_TOKEN, "X-Spur-Api-Url": "http://u:p@web.example"},
        {"X-Spur-Api-Token": API_TOKEN, "X-Spur-Api-Url": "http://web.example/" + "a" * 600},
        {"X-Spur-Api-Token": API_TOKEN, "X-Spur-Api-Url": "http://"},
    ],
)
def test_a_malformed_api_header_is_refused_before_any_shell_starts(
    headers: dict[str, str], agent: str, job: int, launcher: Launcher
) -> None:
    with open_terminal(agent, token(), extra=headers) as ws:
        code, reason = closed_with(ws)
    assert code == terminal.CLOSE_BAD_HEADER, reason
    assert "X-Spur-Api-" in reason
    assert launcher.steps.running() == []


def test_a_minted_api_token_has_the_form_the_agent_takes() -> None:
    assert all(terminal.API_TOKEN_FORM.fullmatch(generate_secret()) for _ in range(50))
