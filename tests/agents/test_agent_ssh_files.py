"""Copying files over the agent's SSH (agents/ssh_transfer.py): SFTP, scp (both protocols)
and rsync, served by the node's own programs in the job's sandbox as the job's identity.
A real launcher runs real sandboxed jobs; asyncssh's SFTP client and OpenSSH's sftp, scp
and rsync (the programs renters use) copy files in and out. What the job cannot see, no
transfer reaches: each path outside the sandbox is shown to exist on the host first."""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import shlex
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import asyncssh
import pytest

from agents import ssh, ssh_transfer
from agents.identity import Identity
from agents.launcher import Launcher
from tests.agents import test_agent_ssh as base
from tests.agents.test_agent_ssh import ALICE, BOB, JOB, OTHER_JOB, SPARE, connect, run
from tests.fixtures.processes import wait_until

service = base.service  # the agent's SSH server, and jobs 51 (acme) and 52 (globex)
job = base.job


def _payload(size: int) -> bytes:
    # No repeating pattern: a relay that dropped or reordered a chunk must not match.
    return random.Random(size).randbytes(size)


async def _home(conn: Any) -> str:
    """Where a shell in the job starts."""
    return str((await conn.run("pwd", check=True)).stdout).strip()


def test_sftp_copies_files_in_and_out_of_the_job_as_its_identity(
    service: ssh.SshService, job: int, identity: Identity, tmp_path: Path
) -> None:
    data = _payload(3 * 1024 * 1024)
    (tmp_path / "up.bin").write_bytes(data)

    async def go() -> dict[str, Any]:
        async with connect(service, ALICE) as conn, conn.start_sftp_client() as sftp:
            seen: dict[str, Any] = {"home": await _home(conn), "start": await sftp.realpath(".")}
            await sftp.mkdir("data")
            await sftp.put(str(tmp_path / "up.bin"), "data/up.bin")
            seen["listed"] = sorted(await sftp.listdir("data"))
            seen["attrs"] = await sftp.stat("data/up.bin")
            # The job sees what came in, as its own.
            seen["in job"] = (await conn.run("sha256sum < data/up.bin; stat -c %u data/up.bin",
                                             check=True)).stdout  # fmt: skip
            await sftp.rename("data/up.bin", "data/moved.bin")
            await sftp.get("data/moved.bin", str(tmp_path / "down.bin"))
            await sftp.remove("data/moved.bin")
            seen["after"] = sorted(await sftp.listdir("data"))
            await sftp.rmdir("data")
            seen["gone"] = not await sftp.exists("data")
            return seen

    seen = run(go())
    assert seen["start"] == seen["home"]  # SFTP starts where a shell starts
    assert seen["listed"] == [".", "..", "up.bin"]
    assert seen["attrs"].size == len(data) and seen["attrs"].uid == identity.uid
    digest, owner = seen["in job"].split("\n")[:2]
    assert digest.split()[0] == hashlib.sha256(data).hexdigest()
    assert int(owner) == identity.uid
    assert (tmp_path / "down.bin").read_bytes() == data
    assert seen["after"] == [".", ".."] and seen["gone"]
    if os.geteuid() == 0:
        assert identity.uid != 0  # never the agent's own user


def test_files_sftp_makes_belong_to_the_jobs_identity_on_the_node(
    service: ssh.SshService, job: int, identity: Identity
) -> None:
    async def go() -> str:
        async with connect(service, SPARE) as conn, conn.start_sftp_client() as sftp:
            await sftp.mkdir("made")
            async with sftp.open("made/file.txt", "w") as out:
                await out.write("hello\n")
            return str(await sftp.realpath("made"))

    made = Path(run(go()))
    for path in (made, made / "file.txt"):
        info = path.stat()  # the host's own view, outside any sandbox
        assert (info.st_uid, info.st_gid) == (identity.uid, identity.gid)
    assert (made / "file.txt").read_text() == "hello\n"


def test_sftp_reaches_only_what_the_job_itself_can_see(
    service: ssh.SshService, job: int, launcher: Launcher, tmp_path: Path
) -> None:
    """Paths outside the sandbox, each shown to exist on the host: the job's own shell
    cannot read them, and neither can SFTP, by any name (absolute, `..`, a symlink)."""
    work_root = Path(launcher.workspaces.root)
    theirs = work_root / "globex" / "jobs" / str(OTHER_JOB) / f"slurm-{OTHER_JOB}.out"
    spool_file = next(Path(launcher.spool_dir).rglob("launch.json"))
    host_tmp = tmp_path / "host-only"
    host_tmp.write_text("the host's /tmp")
    outside = ["/etc/shadow", str(spool_file), str(launcher.spool_dir), str(theirs),
               str(host_tmp)]  # fmt: skip
    wait_until(theirs.exists, timeout=10, what="the other job's output")
    for path in outside:
        assert os.path.exists(path), path  # so a refusal below is the sandbox's doing

    async def go() -> dict[str, Any]:
        async with connect(service, ALICE) as conn, conn.start_sftp_client() as sftp:
            home = await _home(conn)
            up = os.path.relpath(theirs, home)  # ../../../globex/jobs/52/slurm-52.out
            assert up.startswith("../")
            await sftp.symlink(str(theirs), "to-theirs")
            await sftp.symlink(str(spool_file), "to-spool")
            # Made the right way round (the server's version names OpenSSH's sftp-server).
            assert await sftp.readlink("to-theirs") == str(theirs)
            seen: dict[str, Any] = {"sftp": {}, "job": {}}
            for path in [*outside, up, "to-theirs", "to-spool"]:
                try:
                    async with sftp.open(path, "rb") as f:
                        await f.read(1)
                    seen["sftp"][path] = "read"
                except asyncssh.SFTPError as exc:
                    seen["sftp"][path] = type(exc).__name__
                said = await conn.run(f"head -c1 -- {shlex.quote(path)} >/dev/null 2>&1"
                                      " && echo read || echo refused")  # fmt: skip
                seen["job"][path] = said.stdout.strip()
            seen["root listing"] = sorted(await sftp.listdir(str(work_root)))
            seen["up listing"] = sorted(await sftp.listdir(os.path.join(home, "../../..")))
            return seen

    seen = run(go())
    assert all(v == "refused" for v in seen["job"].values()), seen["job"]
    assert all(v != "read" for v in seen["sftp"].values()), seen["sftp"]
    # Not there at all (the sandbox's view), rather than there and forbidden; /etc/shadow
    # is the host's, read-only, and the job's identity may not read it.
    assert seen["sftp"]["/etc/shadow"] == "SFTPPermissionDenied"
    for path in (str(theirs), str(spool_file), str(host_tmp), "to-theirs", "to-spool"):
        assert seen["sftp"][path] == "SFTPNoSuchFile", path
    # The work root holds both organisations on the host; the sandbox shows one.
    assert {"acme", "globex"} <= set(os.listdir(work_root))
    assert seen["root listing"] == [".", "..", "acme"]
    assert seen["up listing"] == [".", "..", "acme"]


def test_sftp_writes_land_in_the_sandbox_not_on_the_host(
    service: ssh.SshService, job: int, tmp_path: Path
) -> None:
    name = f"spur-sftp-{os.getpid()}-{time.time_ns()}"

    async def go() -> dict[str, str]:
        async with connect(service, ALICE) as conn, conn.start_sftp_client() as sftp:
            async with sftp.open(f"/tmp/{name}", "w") as out:  # the job's private /tmp
                await out.write("x")
            seen = {"tmp": "written"}
            for path in (f"/etc/{name}", f"/usr/{name}"):  # the system, read-only
                try:
                    async with sftp.open(path, "w") as out:
                        await out.write("x")
                    seen[path] = "written"
                except asyncssh.SFTPError as exc:
                    seen[path] = type(exc).__name__
            return seen

    seen = run(go())
    assert seen[f"/etc/{name}"] != "written" and seen[f"/usr/{name}"] != "written"
    for path in (f"/tmp/{name}", f"/etc/{name}", f"/usr/{name}"):
        assert not os.path.exists(path), path


@pytest.mark.parametrize(
    ("key", "user"),
    [(BOB, f"job-{JOB}"), (ALICE, f"job-{OTHER_JOB}"),
     (asyncssh.generate_private_key("ssh-ed25519"), f"job-{JOB}")],
    ids=["other tenant's key", "other organisation's job", "stray key"],
)  # fmt: skip
def test_sftp_is_refused_to_a_key_the_job_does_not_carry(
    service: ssh.SshService, job: int, launcher: Launcher, key: asyncssh.SSHKey, user: str
) -> None:
    async def go() -> None:
        async with connect(service, key, user) as conn:
            await conn.start_sftp_client()

    with pytest.raises(asyncssh.PermissionDenied):
        run(go())
    assert launcher.steps.running() == []


def test_an_sftp_session_counts_among_the_jobs_sessions_and_as_use(
    service: ssh.SshService, job: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ssh, "MAX_SESSIONS_PER_JOB", 1)

    async def go() -> tuple[dict[str, Any], dict[str, Any], Any]:
        async with connect(service, ALICE) as conn, conn.start_sftp_client() as sftp:
            idle = service.activity(JOB)
            async with sftp.open("used.txt", "w") as out:
                await out.write("x")
            used = service.activity(JOB)
            with pytest.raises(asyncssh.ChannelOpenError) as refused:
                await conn.run("true")
            return idle, used, refused.value

    started = time.time()
    idle, used, refused = run(go())
    assert idle["sessions"] == 1
    assert used["active_at"] >= started  # what idle culling reads: in use
    assert "at most 1 SSH sessions" in refused.reason
    wait_until(lambda: service.activity(JOB)["sessions"] == 0, timeout=10, what="the count")


def test_the_jobs_end_ends_its_transfers(
    service: ssh.SshService, job: int, launcher: Launcher
) -> None:
    async def go() -> BaseException | None:
        async with connect(service, ALICE) as conn, conn.start_sftp_client() as sftp:
            out = await sftp.open("long.bin", "wb")
            await out.write(b"x" * 65536)
            assert launcher.steps.running() != []  # sftp-server, a task of the job
            launcher.signal(JOB, 1, 9)  # the job's end (a cancel)
            try:
                for _ in range(600):  # a transfer that would go on for 30 s
                    await out.write(b"x" * 65536)
                    await asyncio.sleep(0.05)
            except (asyncssh.Error, OSError) as exc:
                return exc
        return None

    ended = run(go())
    # The channel went away under the client (as it sees it, while writing or between).
    lost = asyncssh.SFTPConnectionLost | asyncssh.SFTPNoConnection | asyncssh.ConnectionLost
    assert isinstance(ended, lost), ended
    wait_until(lambda: launcher.steps.running() == [], timeout=30, what="sftp-server's end")
    wait_until(lambda: launcher.job_request(JOB, 1) is None, timeout=30, what="the job's end")


def test_closing_the_connection_ends_its_sftp_server(
    service: ssh.SshService, job: int, launcher: Launcher
) -> None:
    async def go() -> None:
        async with connect(service, ALICE) as conn:
            sftp = await conn.start_sftp_client()
            await sftp.listdir(".")
            assert launcher.steps.running() != []  # sftp-server, a task of the job

    run(go())
    wait_until(lambda: launcher.steps.running() == [], timeout=30, what="sftp-server's end")
    assert launcher.running() != []  # the job runs on


def test_a_node_without_sftp_server_says_so_and_serves_the_rest(
    service: ssh.SshService, job: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ssh_transfer, "SFTP_SERVERS", ("/usr/lib/nothing/sftp-server",))
    monkeypatch.setattr(ssh_transfer, "TOOL_DIRS", ("/usr/lib/nothing",))

    async def go() -> tuple[Any, Any, Any, Any]:
        async with connect(service, ALICE) as conn:
            sftp = await (await conn.create_process(subsystem="sftp")).wait()
            legacy = await conn.run("scp -t -- .")
            rsync = await conn.run("rsync --server -e.LsfxCIvu . .")
            works = await conn.run("echo still here")
            return sftp, legacy, rsync, works

    sftp, legacy, rsync, works = run(go())
    assert sftp.exit_status == 127
    assert sftp.stderr == f"spurd: {ssh_transfer.MISSING_SFTP}\n"
    assert "(apt-get install openssh-sftp-server" in ssh_transfer.MISSING_SFTP
    assert legacy.exit_status == 127
    assert legacy.stderr == (
        "spurd: scp -O (the legacy SCP protocol) needs scp on this node, which is not "
        "installed (openssh-client)\n"
    )
    assert rsync.exit_status == 127 and "needs rsync on this node" in rsync.stderr
    assert works.stdout == "still here\n"


def test_the_agent_says_at_start_what_it_cannot_serve_and_what_to_install(
    launcher: Launcher, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    monkeypatch.setattr(ssh_transfer, "SFTP_SERVERS", ("/usr/lib/nothing/sftp-server",))
    monkeypatch.setattr(ssh_transfer, "TOOL_DIRS", ("/usr/lib/nothing",))
    server = ssh.SshService(launcher, listen="127.0.0.1:0", host_key_dir=tmp_path)
    with caplog.at_level("INFO", logger="agents.ssh"):
        server.start()
        server.stop()
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warned == [
        f"{ssh_transfer.MISSING_SFTP}; shells, commands, scp -O and rsync work",
        "SSH into jobs: scp -O (openssh-client), rsync (rsync) not offered, the node lacks "
        "the program: install it",
    ]


# -- OpenSSH's own clients ----------------------------------------------------------------

OPENSSH = ("ssh", "sftp", "scp")


@pytest.fixture
def openssh(service: ssh.SshService, tmp_path: Path) -> dict[str, Any]:
    """What OpenSSH's clients need to reach the agent as a renter would: alice's key in a
    file, the agent's host key in known_hosts, and nothing of this machine's own config."""
    missing = [name for name in (*OPENSSH, "rsync") if shutil.which(name) is None]
    assert not missing, f"install openssh-client and rsync (.ci/run does): {missing}"
    home = tmp_path / "home"
    home.mkdir()
    key = tmp_path / "alice"
    key.write_bytes(ALICE.export_private_key())
    key.chmod(0o600)
    stray = tmp_path / "stray"
    stray.write_bytes(asyncssh.generate_private_key("ssh-ed25519").export_private_key())
    stray.chmod(0o600)
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{service.port} {service.host_key_line}\n")
    options = ["-F", "/dev/null", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
               "-o", f"UserKnownHostsFile={known}", "-o", "GlobalKnownHostsFile=/dev/null",
               "-o", "StrictHostKeyChecking=yes"]  # fmt: skip
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C"}
    return {"options": options, "key": key, "stray": stray, "env": env, "port": service.port}


def _client(openssh: dict[str, Any], argv: list[str], *, stdin: str = "") -> Any:
    return subprocess.run(argv, input=stdin, capture_output=True, text=True,
                          env=openssh["env"], timeout=60)  # fmt: skip


def test_openssh_sftp_scp_and_rsync_copy_files_as_on_any_host(
    openssh: dict[str, Any], job: int, identity: Identity, tmp_path: Path
) -> None:
    port, options, key = str(openssh["port"]), openssh["options"], str(openssh["key"])
    target = f"job-{JOB}@127.0.0.1"
    data = _payload(1024 * 1024)
    local = tmp_path / "local"
    local.mkdir()
    (local / "a.bin").write_bytes(data)
    ssh_cmd = ["ssh", *options, "-i", key, "-p", port, target]
    home = _client(openssh, [*ssh_cmd, "pwd"]).stdout.strip()
    assert home.endswith(f"/jobs/{JOB}"), home

    # sftp, in batch mode: upload, list, rename, download, remove.
    batch = (f"mkdir in\nput {local / 'a.bin'} in/a.bin\nls -l in\nrename in/a.bin in/b.bin\n"
             f"get in/b.bin {local / 'b.bin'}\nrm in/b.bin\nls in\nrmdir in\n")  # fmt: skip
    said = _client(openssh, ["sftp", *options, "-i", key, "-P", port, "-b", "-", target],
                   stdin=batch)  # fmt: skip
    assert said.returncode == 0, said.stderr
    [listed] = [line for line in said.stdout.splitlines()
                if line.endswith(" in/a.bin") and not line.startswith("sftp>")]  # fmt: skip
    assert listed.split()[2] in (str(identity.uid), identity.name)  # its owner
    assert (local / "b.bin").read_bytes() == data
    assert not Path(home, "in").exists()

    # scp: OpenSSH 9's (over SFTP), then the legacy protocol (`scp -t` in the sandbox).
    for mode, name in (([], "sftp.bin"), (["-O"], "legacy.bin")):
        said = _client(openssh, ["scp", *mode, *options, "-i", key, "-P", port,
                                 str(local / "a.bin"), f"{target}:{name}"])  # fmt: skip
        assert said.returncode == 0, (mode, said.stderr)
        assert Path(home, name).read_bytes() == data
        assert Path(home, name).stat().st_uid == identity.uid
        back = local / f"back-{name}"
        said = _client(openssh, ["scp", *mode, *options, "-i", key, "-P", port,
                                 f"{target}:{name}", str(back)])  # fmt: skip
        assert said.returncode == 0, (mode, said.stderr)
        assert back.read_bytes() == data

    # rsync over ssh: the node's rsync runs in the sandbox (`rsync --server`).
    shell = shlex.join(["ssh", *options, "-i", key, "-p", port])
    said = _client(openssh, ["rsync", "-a", "-e", shell, f"{local}/", f"{target}:synced/"])
    assert said.returncode == 0, said.stderr
    assert Path(home, "synced", "a.bin").read_bytes() == data
    assert Path(home, "synced", "a.bin").stat().st_uid == identity.uid
    said = _client(openssh, ["rsync", "-a", "-e", shell, f"{target}:synced/a.bin",
                             str(local / "rsynced.bin")])  # fmt: skip
    assert said.returncode == 0, said.stderr
    assert (local / "rsynced.bin").read_bytes() == data

    # Outside the sandbox: the host has it, the transfer does not.
    said = _client(openssh, ["scp", *options, "-i", key, "-P", port,
                             f"{target}:/etc/shadow", str(local / "shadow")])  # fmt: skip
    assert said.returncode != 0 and not (local / "shadow").exists()


def test_openssh_clients_are_refused_without_a_key_of_that_job(
    openssh: dict[str, Any], job: int, tmp_path: Path
) -> None:
    port, options = str(openssh["port"]), openssh["options"]
    (tmp_path / "f").write_text("x")
    for key, user in ((openssh["stray"], f"job-{JOB}"), (openssh["key"], f"job-{OTHER_JOB}")):
        for argv in (
            ["sftp", *options, "-i", str(key), "-P", port, "-b", "-", f"{user}@127.0.0.1"],
            ["scp", *options, "-i", str(key), "-P", port, str(tmp_path / "f"),
             f"{user}@127.0.0.1:f"],
        ):  # fmt: skip
            said = _client(openssh, argv, stdin="ls\n")
            assert said.returncode != 0
            assert "Permission denied (publickey)" in said.stderr, said.stderr


def test_openssh_sftp_says_why_when_the_node_lacks_sftp_server(
    openssh: dict[str, Any], job: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ssh_transfer, "SFTP_SERVERS", ("/usr/lib/nothing/sftp-server",))
    port, options, key = str(openssh["port"]), openssh["options"], str(openssh["key"])
    said = _client(openssh, ["sftp", *options, "-i", key, "-P", port, "-b", "-",
                             f"job-{JOB}@127.0.0.1"], stdin="ls\n")  # fmt: skip
    assert said.returncode != 0
    assert f"spurd: {ssh_transfer.MISSING_SFTP}" in said.stderr


# -- which program serves what (agents/ssh_transfer.py) ---------------------------------


@pytest.mark.parametrize(
    ("command", "refused"),
    [
        ("scp -t -- .", "scp"),  # what `scp -O` sends, to copy in
        ("scp -v -r -p -f -- data", "scp"),  # ... and to copy out
        ("rsync --server -logDtpre.iLsfxCIvu . dir/", "rsync"),
        ("rsync --server --sender -e.LsfxCIvu . a.bin", "rsync"),
        ("scp a b", None),  # a command the job runs itself: its shell answers
        ("/opt/rsync/bin/rsync --server . x", None),  # a program the client named
        ("echo scp -t", None),
        ("", None),
    ],
)
def test_a_transfer_whose_program_the_node_lacks_is_named_and_nothing_else(
    monkeypatch: pytest.MonkeyPatch, command: str, refused: str | None
) -> None:
    assert ssh_transfer.missing_tool(command) is None  # all installed here
    monkeypatch.setattr(ssh_transfer, "TOOL_DIRS", ("/usr/lib/nothing",))
    said = ssh_transfer.missing_tool(command)
    if refused is None:
        assert said is None
    else:
        assert said is not None and f"needs {refused} on this node" in said
        assert f"({ssh_transfer.TOOLS[refused]})" in said


def test_only_a_program_every_sandbox_shows_and_any_identity_runs_serves_sftp(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert ssh_transfer.sftp_server() is not None  # the node's own, installed
    outside = tmp_path / "sftp-server"  # runnable, but no sandbox shows /tmp's
    outside.write_text("#!/bin/sh\n")
    outside.chmod(0o755)
    installed = Path(str(ssh_transfer.sftp_server()))
    assert installed.stat().st_mode & 0o001
    monkeypatch.setattr(ssh_transfer, "SFTP_SERVERS", (str(outside), "/usr/lib/nothing/x"))
    assert ssh_transfer.sftp_server() is None
    monkeypatch.setattr(ssh_transfer, "SFTP_SERVERS", ("/etc/shadow", str(installed)))
    assert ssh_transfer.sftp_server() == str(installed)  # /etc/shadow: no one may run it
