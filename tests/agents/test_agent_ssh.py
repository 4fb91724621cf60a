"""The agent's SSH server (agents/ssh.py), over a real launcher running real sandboxed jobs
on simulated GPUs, reached with a real SSH client (asyncssh's): a key the job carries
opens a shell or runs a command in the job's sandbox, as the job's identity, with the
job's environment; anything else (another key, another job, an ended job, a name that is
no job's, a password) gets nothing, and neither does any kind of forwarding."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncssh
import pytest
from starlette.testclient import TestClient

from agents import ssh
from agents.api import create_app
from agents.identity import Identity
from agents.launcher import Launcher, LaunchRequest
from tests.agents.conftest import OTHER_TENANT, make_payload
from tests.agents.test_agent_terminal import marked
from tests.fixtures.processes import wait_until

JOB = 51
OTHER_JOB = 52
ALICE = asyncssh.generate_private_key("ssh-ed25519")
BOB = asyncssh.generate_private_key("ssh-ed25519")  # another tenant's person
SPARE = asyncssh.generate_private_key("ecdsa-sha2-nistp256")  # alice's second key


@pytest.fixture
def service(launcher: Launcher, tmp_path: Path) -> Iterator[ssh.SshService]:
    server = ssh.SshService(launcher, listen="127.0.0.1:0", host_key_dir=tmp_path)
    server.start()
    yield server
    server.stop()


def run_job(launcher: Launcher, job_id: int, keys: list[asyncssh.SSHKey], **spec: Any) -> None:
    payload = make_payload(
        job_id,
        "#!/bin/sh\nexec sleep 600\n",
        ssh_keys=[ssh.public_line(k) for k in keys],
        environment={"SPUR_SESSION_MARK": "from the job"},
        **spec,
    )
    launcher.launch(LaunchRequest.from_payload(payload))
    wait_until(
        lambda: any(j["job_id"] == job_id for j in launcher.running()), timeout=20, what="job"
    )


@pytest.fixture
def job(launcher: Launcher) -> int:
    """A running session-like job that carries alice's two keys; and another
    organisation's job beside it, carrying bob's."""
    run_job(launcher, JOB, [ALICE, SPARE])
    run_job(launcher, OTHER_JOB, [BOB], tenant=OTHER_TENANT, user="bob")
    return JOB


def connect(service: ssh.SshService, key: asyncssh.SSHKey | None, user: str = f"job-{JOB}",
            **options: Any) -> Any:  # fmt: skip
    return asyncssh.connect(
        "127.0.0.1",
        service.port,
        username=user,
        client_keys=[key] if key is not None else [],
        known_hosts=None,
        agent_path=None,
        password=options.pop("password", None),
        **options,
    )


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_a_command_runs_in_the_job_as_its_identity_and_returns_its_output_and_status(
    service: ssh.SshService, job: int, identity: Identity
) -> None:
    async def go() -> Any:
        async with connect(service, ALICE) as conn:
            said = await conn.run(
                "echo id=$(id -u) job=$SLURM_JOB_ID mark=$SPUR_SESSION_MARK me=$SPUR_USER;"
                " echo oops >&2; exit 3"
            )
            ended = await conn.run("kill -TERM $$")
            return said, ended

    said, ended = run(go())
    assert said.stdout == f"id={identity.uid} job={JOB} mark=from the job me=alice\n"
    assert said.stderr == "oops\n"
    assert said.exit_status == 3
    assert ended.exit_status == 128 + 15  # as its supervisor saw it end
    if os.geteuid() == 0:
        assert identity.uid != 0  # never the agent's own user


def test_a_shell_with_a_terminal_runs_in_the_jobs_sandbox(
    service: ssh.SshService, job: int, identity: Identity, launcher: Launcher
) -> None:
    async def go() -> str:
        async with connect(service, SPARE) as conn:
            process = await conn.create_process(term_type="xterm", term_size=(100, 30),
                                                encoding=None)  # fmt: skip
            process.stdin.write(b"echo id=$(id -u) tty=$([ -t 0 ] && echo yes) job=$SLURM_JOB_ID;"
                                b" stty size\n")  # fmt: skip
            process.stdin.write(b"cat /proc/1/cmdline | tr '\\0' ' ';"
                                b" echo; echo do''ne; exit 7\n")  # fmt: skip
            seen = b""
            while b"done" not in seen:
                seen += await process.stdout.read(4096)
            result = await process.wait()
            assert result.exit_status == 7
            return seen.decode(errors="replace")

    seen = run(go())
    assert f"id={identity.uid} tty=yes job={JOB}" in seen
    assert "30 100" in seen  # the size the client asked for
    # Its PID 1 is the sandbox's (bubblewrap, in a PID namespace of its own).
    assert "bwrap --unshare-pid" in seen
    wait_until(lambda: launcher.steps.running() == [], timeout=30, what="the shell's end")
    assert launcher.running() != []  # the job runs on


def test_the_command_reads_its_stdin_to_the_end(service: ssh.SshService, job: int) -> None:
    async def go() -> Any:
        async with connect(service, ALICE) as conn:
            return await conn.run("wc -c", input=b"x" * 300_000, encoding=None)

    result = run(go())
    assert result.stdout.strip() == b"300000" and result.exit_status == 0


@pytest.mark.parametrize(
    ("key", "user"),
    [
        (BOB, f"job-{JOB}"),  # another tenant's key
        (ALICE, f"job-{OTHER_JOB}"),  # a key of this job, for another organisation's job
        (ALICE, "job-9999"),  # no such job
        (ALICE, "root"),  # a name that is no job's
        (ALICE, "job-051"),  # not the job's name as written
        (asyncssh.generate_private_key("ssh-ed25519"), f"job-{JOB}"),  # nobody's key
    ],
    ids=["other tenant's key", "other job", "no such job", "root", "padded id", "stray key"],
)
def test_anything_but_a_key_of_that_running_job_is_refused(
    service: ssh.SshService, job: int, launcher: Launcher, key: asyncssh.SSHKey, user: str
) -> None:
    with pytest.raises(asyncssh.PermissionDenied):
        run(connect(service, key, user))
    assert launcher.steps.running() == []


def test_a_password_is_never_asked_for(service: ssh.SshService, job: int) -> None:
    with pytest.raises(asyncssh.PermissionDenied):
        run(connect(service, None, password="anything"))


def test_a_job_that_ended_lets_nobody_in_and_ends_its_sessions(
    service: ssh.SshService, job: int, launcher: Launcher
) -> None:
    async def go() -> Any:
        async with connect(service, ALICE) as conn:
            process = await conn.create_process("echo sta''rted; exec sleep 300")
            assert (await process.stdout.readline()) == "started\n"
            launcher.signal(JOB, 1, 9)  # the job's end (a cancel)
            return await process.wait()

    result = run(go())
    assert result.exit_status != 0 or result.exit_signal is not None
    wait_until(lambda: launcher.job_request(JOB, 1) is None, timeout=30, what="the job's end")
    with pytest.raises(asyncssh.PermissionDenied):
        run(connect(service, ALICE))


def test_closing_the_connection_kills_the_shell_and_what_it_started(
    service: ssh.SshService, job: int, launcher: Launcher
) -> None:
    mark = "4343.5"

    async def go() -> None:
        async with connect(service, ALICE) as conn:
            process = await conn.create_process(f"sleep {mark} & echo sta''rted; wait")
            assert (await process.stdout.readline()) == "started\n"
            wait_until(lambda: marked(f"sleep\0{mark}"), timeout=30, what="the sleep")

    run(go())
    wait_until(lambda: not marked(f"sleep\0{mark}"), timeout=30, what="the sleep's end")
    wait_until(lambda: launcher.steps.running() == [], timeout=30, what="the session's end")


def test_every_kind_of_forwarding_is_refused(service: ssh.SshService, job: int) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]

    async def go() -> None:
        async with connect(service, ALICE) as conn:
            with pytest.raises(asyncssh.ChannelOpenError) as local:
                await conn.open_connection("127.0.0.1", port)  # ssh -L
            assert local.value.reason == ssh.REFUSED_FORWARDING
            with pytest.raises(asyncssh.ChannelListenError):
                await conn.forward_remote_port("127.0.0.1", 0, "127.0.0.1", port)  # ssh -R
            with pytest.raises(asyncssh.ChannelOpenError):
                await conn.open_unix_connection("/run/spur.sock")
            with pytest.raises(asyncssh.ChannelOpenError):  # a subsystem but sftp
                await conn.create_process(subsystem="netconf")
            # Agent forwarding asked for: the session runs, without an agent socket.
            said = await conn.run("echo agent=${SSH_AUTH_SOCK-none}")
            assert said.stdout == "agent=none\n"

    try:
        run(go())
    finally:
        listener.close()


def test_a_job_has_a_few_sessions_at_most(
    service: ssh.SshService, job: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ssh, "MAX_SESSIONS_PER_JOB", 2)

    async def go() -> Any:
        async with connect(service, ALICE) as conn:
            one = await conn.create_process("echo u''p; exec sleep 300")
            two = await conn.create_process("echo u''p; exec sleep 300")
            for process in (one, two):
                assert (await process.stdout.readline()) == "up\n"
            with pytest.raises(asyncssh.ChannelOpenError) as refused:
                await conn.create_process("true")
            one.close()
            await one.wait_closed()
            return refused.value

    assert "at most 2 SSH sessions" in run(go()).reason


def test_connections_still_logging_in_are_bounded(
    service: ssh.SshService, job: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flood of connections that never log in: the ones past the bound are turned
    away at once, and a client logs in again once they have gone."""
    monkeypatch.setattr(ssh, "MAX_UNAUTHENTICATED_PER_ADDRESS", 3)
    held = []
    for _ in range(3):
        sock = socket.create_connection(("127.0.0.1", service.port))
        sock.sendall(b"SSH-2.0-flood\r\n")
        held.append(sock)
    wait_until(lambda: sum(service.unauthenticated.values()) == 3, timeout=10, what="counts")
    with pytest.raises((asyncssh.DisconnectError, ConnectionError, OSError)):
        run(connect(service, ALICE))
    for sock in held:
        sock.close()
    wait_until(lambda: not service.unauthenticated, timeout=10, what="the flood to go")

    async def go() -> Any:
        async with connect(service, ALICE) as conn:
            return (await conn.run("echo in")).stdout

    assert run(go()) == "in\n"


def test_the_host_key_is_made_once_and_kept_private(tmp_path: Path) -> None:
    first = ssh.host_key(tmp_path)
    assert (tmp_path / ssh.HOST_KEY_FILE).stat().st_mode & 0o777 == 0o600
    assert ssh.public_line(ssh.host_key(tmp_path)) == ssh.public_line(first)
    assert ssh.public_line(first).startswith("ssh-ed25519 ")


def test_the_client_sees_the_host_key_the_agent_reports(service: ssh.SshService, job: int) -> None:
    async def go() -> str:
        async with connect(service, ALICE) as conn:
            return ssh.public_line(conn.get_server_host_key())

    assert run(go()) == service.host_key_line


def test_only_the_locale_of_what_a_client_sends_reaches_the_shell_and_the_rest_is_bounded(
    service: ssh.SshService, job: int
) -> None:
    sent = {"LANG": "C.UTF-8", "LC_TIME": "en_GB.UTF-8", "LD_PRELOAD": "/tmp/x.so",
            "PATH": "/tmp", **{f"V{i}": "x" * 1000 for i in range(200)},
            "LC_PAPER": "sent after too many"}  # fmt: skip

    async def go() -> Any:
        async with connect(service, ALICE) as conn:
            return await conn.run(
                'echo "$LANG|$LC_TIME|${LD_PRELOAD-unset}|${V1-unset}|${LC_PAPER-unset}";'
                ' echo "$PATH"',
                env=sent,
            )

    said = run(go())
    lines = said.stdout.splitlines()
    assert lines[0] == "C.UTF-8|en_GB.UTF-8|unset|unset|unset"  # past MAX_ENV: refused
    assert lines[1] != "/tmp"  # the job's PATH, not the client's


def test_a_job_takes_a_few_connections_at_most(
    service: ssh.SshService, job: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ssh, "MAX_CONNECTIONS_PER_JOB", 2)

    async def go() -> None:
        async with connect(service, ALICE), connect(service, SPARE):
            with pytest.raises((asyncssh.DisconnectError, asyncssh.ChannelOpenError)):
                async with connect(service, ALICE) as third:
                    await third.run("true")
        # Once they are gone, room again.
        async with connect(service, ALICE) as again:
            assert (await again.run("echo in")).stdout == "in\n"

    run(go())
    wait_until(lambda: service.job_connections == {}, timeout=10, what="the counts to drop")


def test_the_agent_api_says_when_ssh_last_used_a_job(
    service: ssh.SshService, job: int, launcher: Launcher
) -> None:
    """What the web's idle culling asks: a session used over SSH is in use."""
    app = create_app(launcher=launcher, token="cluster-token", ssh=service)
    with TestClient(app) as api:
        headers = {"Authorization": "Bearer cluster-token"}
        before = api.get(f"/v1/jobs/{JOB}/ssh", headers=headers).json()
        assert before == {"job_id": JOB, "sessions": 0, "active_at": None}

        async def go() -> None:
            async with connect(service, ALICE) as conn:
                await conn.run("echo used")

        started = time.time()
        run(go())
        after = api.get(f"/v1/jobs/{JOB}/ssh", headers=headers).json()
        assert after["active_at"] >= started and after["sessions"] == 0
        assert api.get(f"/v1/jobs/{JOB}/ssh").status_code == 401  # the cluster token's
