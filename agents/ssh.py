"""SSH into the jobs running here: the agent's own SSH server (asyncssh), on one port for
every job, so no sshd and no port per job.

    ssh -p 2222 job-41@node1 ─▶ spurd [agent] ssh_listen ─▶ a PTY (or pipes) ─▶ a step's
                                  key in job 41's ssh_keys?   sandbox, as the job's
                                                              identity (agents/jobtask.py)

Who gets in: the user name names the job (`job-<id>`, scheduler/core/contract/ssh.py);
the job must be running here (its batch script on this node, as the web terminal's
jobs are); and the client must prove it holds one of the public keys the job carries
(`spec.ssh_keys`, the submitter's account keys stamped at launch and fixed from then
on). Public keys only: no password, keyboard-interactive or host-based login. Every
refusal looks the same from outside ("Permission denied (publickey)"), whether the job
is missing, another's, ended or the key is wrong; the log says which.

What a session gets: a shell (a PTY when the client asks for one, `bash -i`, as the web
terminal's), a command (`ssh ... 'nvidia-smi'`: `bash -c`, its output, its exit
status or signal), or the `sftp` subsystem (sftp, scp; OpenSSH's sftp-server, see
agents/ssh_transfer.py), started through the same path as the web terminal's shell
(`StepRunner.start_shell`): the job's identity, a sandbox of its own with the job's
GPUs, the job's cgroup and CPUs, the job's environment (srun works in it), fenced by the
node's lease and ended with the job. Never a process outside a sandbox, never as the
agent's user (unless the agent is a personal one, which runs every job as itself).
`scp -O` and `rsync -e ssh` are commands like any other (the node's scp and rsync).

Refused, with the client told: port forwarding both ways (TCP and Unix sockets),
agent and X11 forwarding, subsystems other than sftp, tun/tap.

Bounded: connections not yet logged in (in all, and per client address) and the time
one may take to log in; connections in all; sessions per job; the environment a
client sends (only LANG and LC_* are passed on); the command's length; input is held
back (the channel's window stays shut) while the shell does not read.

The host key is the agent's own, made once (Ed25519) in its spool, which no sandbox
shows; its public line is reported at registration with the address clients dial
(the node's labels), so the portal can show `ssh -p PORT job-ID@HOST` and the
known_hosts line.

The server runs on an event loop of its own, in a thread: a flood of handshakes must
not slow the agent API's loop (launches, the web terminal).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import asyncssh

from agents import ssh_transfer
from agents.ssh_session import Login, Session
from scheduler.core.contract import ssh as contract

if TYPE_CHECKING:
    from agents.launcher import Launcher

T = TypeVar("T")

log = logging.getLogger(__name__)

HOST_KEY_FILE = "ssh_host_ed25519_key"
MAX_UNAUTHENTICATED = 64  # connections still logging in, from everyone
MAX_UNAUTHENTICATED_PER_ADDRESS = 8  # ... from one client address
MAX_CONNECTIONS = 256  # logged in or not
MAX_CONNECTIONS_PER_JOB = 16  # logged in to one job: a tenant cannot take them all
MAX_SESSIONS_PER_JOB = 8  # shells and commands open in one job at once
LOGIN_TIMEOUT_S = 20.0
MAX_ENV = 32  # environment variables a session may send (most are ignored)
BLOCKING_THREADS = 4  # sandboxes started or ended at once; more wait their turn
REFUSED_FORWARDING = "port forwarding is not offered by Spur's SSH"
# SFTP clients (asyncssh's, WinSCP) swap SYMLINK's arguments for OpenSSH's
# sftp-server, which has them the other way round, when the server's version names
# OpenSSH: in its comment, which OpenSSH clients' own quirk table (matched on the start)
# leaves alone.
SERVER_VERSION = "Spur sftp-server/OpenSSH"
LOGIN_BANNER = (
    "Spur: log in as job-<id>, the id of your running session's job "
    "(its page shows the command).\r\n"
)


class SshUnavailable(RuntimeError):
    """The SSH server could not start (the port is taken, the host key is unreadable)."""


def host_key(spool: Path) -> asyncssh.SSHKey:
    """The agent's host key: made once, kept in its spool (mode 0600), read ever after."""
    path = spool / HOST_KEY_FILE
    if not path.exists():
        key = asyncssh.generate_private_key("ssh-ed25519")
        with contextlib.suppress(FileExistsError):  # another start made it meanwhile
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(key.export_private_key())
    try:
        return asyncssh.read_private_key(str(path))
    except (OSError, asyncssh.KeyImportError) as exc:
        raise SshUnavailable(f"cannot read the SSH host key {path}: {exc}") from exc


def public_line(key: asyncssh.SSHKey) -> str:
    """`<type> <base64>` of a key, as known_hosts and authorized_keys hold it."""
    exported = key.export_public_key("openssh").decode()
    kind, data = exported.split()[:2]
    return f"{kind} {data}"


def advertised_address(listen: str, address: str, agent_url: str) -> str:
    """The "HOST:PORT" clients dial: `address` when set, else the agent URL's host and
    the SSH port (a server listening everywhere says nothing about how it is reached)."""
    if address:
        return address
    from urllib.parse import urlsplit

    host = urlsplit(agent_url).hostname or listen.rpartition(":")[0].strip("[]")
    port = listen.rpartition(":")[2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _say_transfers() -> None:
    """Which ways to copy files this node serves, and what to install for the others."""
    found = ssh_transfer.offered()
    if found["sftp"] is None:
        log.warning("%s; shells, commands, scp -O and rsync work", ssh_transfer.MISSING_SFTP)
    missing = [f"{way} ({ssh_transfer.TOOLS[way.split()[0]]})" for way in ("scp -O", "rsync")
               if found[way] is None]  # fmt: skip
    if missing:
        log.warning("SSH into jobs: %s not offered, the node lacks the program: install it",
                    ", ".join(missing))  # fmt: skip
    offered = ", ".join(f"{way} by {path}" for way, path in found.items() if path)
    log.info("SSH into jobs copies files with %s", offered or "nothing")


class JobLogins:
    """Which running job a login name reaches, and whether a key opens it."""

    def __init__(self, launcher: Launcher) -> None:
        self.launcher = launcher
        self._keys: dict[tuple[int, int], list[bytes]] = {}

    def running(self, job_id: int) -> tuple[Login, tuple[str, ...]] | None:
        """The job's attempt whose batch script runs here, with its keys; None otherwise."""
        for job in self.launcher.running():
            if int(job["job_id"]) != job_id:
                continue
            request = self.launcher.job_request(job_id, int(job["attempt"]))
            if request is not None and request.first_node == self.launcher.node:
                login = Login(job_id, request.attempt, request.spec.user)
                return login, request.spec.ssh_keys
        return None

    def authorise(self, job_id: int, key: asyncssh.SSHKey) -> tuple[Login | None, str]:
        """The login `key` opens in job `job_id`, or None and why not (for the log)."""
        found = self.running(job_id)
        if found is None:
            return None, f"job {job_id} does not run here"
        login, lines = found
        if not lines:
            return None, f"job {job_id} carries no SSH keys"
        cache = (login.job_id, login.attempt)
        if cache not in self._keys:
            self._keys = {k: v for k, v in self._keys.items() if self.running(k[0])}
            self._keys[cache] = _public_data(lines)
        if key.public_data in self._keys[cache]:
            return login, ""
        return None, f"the key is not one of job {job_id}'s"

    def still_running(self, login: Login) -> bool:
        found = self.running(login.job_id)
        return found is not None and found[0].attempt == login.attempt


def _public_data(lines: tuple[str, ...]) -> list[bytes]:
    out = []
    for line in lines:
        try:
            out.append(asyncssh.import_public_key(line).public_data)
        except (asyncssh.KeyImportError, ValueError):
            log.warning("a job's SSH key could not be read; it opens nothing")
    return out


class _BoundedEnvChannel(asyncssh.SSHServerChannel):  # type: ignore[type-arg]
    """asyncssh keeps every environment request a client sends, without a bound: a
    session may send MAX_ENV of them, the rest are refused."""

    def _process_env_request(self, packet: Any) -> bool:
        if len(self._env) >= MAX_ENV:
            return False
        return bool(super()._process_env_request(packet))


class SshService:
    """The server: its listener on its own loop and thread, and the counts that bound it."""

    def __init__(self, launcher: Launcher, *, listen: str, host_key_dir: Path) -> None:
        self.launcher = launcher
        self.logins = JobLogins(launcher)
        self.key = host_key(host_key_dir)
        self.host_key_line = public_line(self.key)
        host, _, port = listen.rpartition(":")
        self._host, self._port = host.strip("[]"), int(port)
        self.port = self._port  # the bound one, once started (0 picks a free port)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncssh.SSHAcceptor | None = None
        self.connections: set[_Server] = set()
        self.unauthenticated: dict[str, int] = {}
        self.job_connections: dict[int, int] = {}
        self.sessions: dict[int, int] = {}
        self.open_sessions: set[Session] = set()
        self.active_at: dict[int, float] = {}  # job -> when its SSH last relayed a byte
        self._executor = ThreadPoolExecutor(BLOCKING_THREADS, thread_name_prefix="spurd-ssh")
        self._tasks: set[asyncio.Future[None]] = set()

    async def blocking(self, call: Callable[[], T]) -> T:
        """`call` on one of the service's threads (a sandbox's start or end blocks)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def track(self, task: asyncio.Future[None]) -> None:
        """Keep a task referenced until it is done (the loop holds only weak ones)."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- lifecycle (from the agent's threads) -------------------------------------------

    def start(self) -> None:
        ready = threading.Event()
        failed: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self._server = loop.run_until_complete(self._listen())
                sockets = self._server.sockets
                if sockets:
                    self.port = int(sockets[0].getsockname()[1])
            except BaseException as exc:  # noqa: BLE001 - handed to start()'s caller
                failed.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self._shutdown())
                loop.close()
                self._executor.shutdown(wait=False)

        self._thread = threading.Thread(target=run, name="spurd-ssh", daemon=True)
        self._thread.start()
        ready.wait()
        if failed:
            raise SshUnavailable(f"cannot serve SSH on {self._host}:{self._port}: {failed[0]}")
        log.info("serving SSH into jobs on %s:%d (host key %s)", self._host, self.port,
                 self.key.get_fingerprint())  # fmt: skip
        _say_transfers()

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or not thread.is_alive():
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)

    async def _listen(self) -> asyncssh.SSHAcceptor:
        return await asyncssh.listen(
            self._host,
            self._port,
            server_factory=lambda: _Server(self),
            server_host_keys=[self.key],
            config=None,
            public_key_auth=True,
            password_auth=False,
            kbdint_auth=False,
            host_based_auth=False,
            gss_auth=False,
            gss_kex=False,
            agent_forwarding=False,
            x11_forwarding=False,
            allow_pty=True,
            line_editor=False,
            encoding=None,
            login_timeout=LOGIN_TIMEOUT_S,
            keepalive_interval=60,
            server_version=SERVER_VERSION,
        )

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for server in list(self.connections):
            server.close()
        for session in list(self.open_sessions):
            await session.finish()
        if self._tasks:  # the sessions' own ends, under way
            await asyncio.wait(set(self._tasks), timeout=10)

    # -- the counts (on the loop's thread only) ---------------------------------------------

    def admit(self, server: _Server) -> str | None:
        """Why a new connection is refused, or None (and it is counted)."""
        address = server.address
        pending = sum(self.unauthenticated.values())
        if len(self.connections) >= MAX_CONNECTIONS:
            return "too many SSH connections to this node"
        if pending >= MAX_UNAUTHENTICATED:
            return "too many SSH connections logging in to this node"
        if self.unauthenticated.get(address, 0) >= MAX_UNAUTHENTICATED_PER_ADDRESS:
            return "too many SSH connections logging in from your address"
        self.connections.add(server)
        self.unauthenticated[address] = self.unauthenticated.get(address, 0) + 1
        return None

    def logged_in(self, server: _Server, job_id: int) -> str | None:
        """Why a connection that just logged in to `job_id` is refused, or None (it no
        longer counts as logging in, and counts for its job)."""
        self._uncount_pending(server.address)
        if self.job_connections.get(job_id, 0) >= MAX_CONNECTIONS_PER_JOB:
            self.connections.discard(server)
            return f"at most {MAX_CONNECTIONS_PER_JOB} SSH connections to a job at once"
        self.job_connections[job_id] = self.job_connections.get(job_id, 0) + 1
        return None

    def gone(self, server: _Server) -> None:
        if server not in self.connections:
            return
        self.connections.discard(server)
        if server.login is None:
            self._uncount_pending(server.address)
            return
        left = self.job_connections.get(server.login.job_id, 0) - 1
        if left > 0:
            self.job_connections[server.login.job_id] = left
        else:
            self.job_connections.pop(server.login.job_id, None)

    def _uncount_pending(self, address: str) -> None:
        left = self.unauthenticated.get(address, 0) - 1
        if left > 0:
            self.unauthenticated[address] = left
        else:
            self.unauthenticated.pop(address, None)

    def note_activity(self, job_id: int) -> None:
        """A session in the job relayed something: idle culling asks (GET /v1/jobs/{id}/ssh)."""
        self.active_at[job_id] = time.time()

    def activity(self, job_id: int) -> dict[str, Any]:
        """What the web's idle culling reads (from the API's threads: plain reads)."""
        return {"sessions": self.sessions.get(job_id, 0), "active_at": self.active_at.get(job_id)}

    def claim_session(self, job_id: int) -> bool:
        if self.sessions.get(job_id, 0) >= MAX_SESSIONS_PER_JOB:
            return False
        self.sessions[job_id] = self.sessions.get(job_id, 0) + 1
        return True

    def release_session(self, job_id: int) -> None:
        left = self.sessions.get(job_id, 0) - 1
        if left > 0:
            self.sessions[job_id] = left
        else:
            self.sessions.pop(job_id, None)
            if not self.logins.running(job_id):  # ended: nobody will ask any more
                self.active_at.pop(job_id, None)


class _Server(asyncssh.SSHServer):
    """One client connection: its login, then the sessions it opens."""

    def __init__(self, service: SshService) -> None:
        self.service = service
        self.conn: asyncssh.SSHServerConnection | None = None
        self.address = ""
        self.login: Login | None = None
        self.candidate: tuple[str, Login] | None = None
        self.counted = False
        self.job_id: int | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self.conn = conn
        peer = conn.get_extra_info("peername") or ("", 0)
        self.address = str(peer[0])
        refusal = self.service.admit(self)
        if refusal is not None:
            log.warning("SSH from %s refused: %s", self.address, refusal)
            conn.disconnect(asyncssh.DISC_TOO_MANY_CONNECTIONS, refusal)
            return
        self.counted = True

    def connection_lost(self, exc: Exception | None) -> None:
        if self.counted:
            self.service.gone(self)
            self.counted = False

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()

    def begin_auth(self, username: str) -> bool:
        self.job_id = contract.job_of_login(username)
        if self.job_id is None and self.conn is not None:
            # Not a job's name: say what the name is (this tells nothing about any job).
            self.conn.send_auth_banner(LOGIN_BANNER)
        return True  # every login must prove a key, whatever the name

    def password_auth_supported(self) -> bool:
        return False

    def kbdint_auth_supported(self) -> bool:
        return False

    def host_based_auth_supported(self) -> bool:
        return False

    def public_key_auth_supported(self) -> bool:
        return True

    def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        # asyncssh asks this for a key offered without a signature too, and checks a
        # signature only after it: what is kept is the last answer, whatever it was, and
        # taken at auth_completed only, which follows a yes and a good signature at once.
        self.candidate = None
        job_id = contract.job_of_login(username)
        if job_id is None:
            log.info("SSH from %s: %r is not a job's login name", self.address, username[:64])
            return False
        login, why = self.service.logins.authorise(job_id, key)
        if login is None:
            log.info("SSH from %s to job %s refused: %s", self.address, job_id, why)
            return False
        self.candidate = (username, login)
        return True

    def auth_completed(self) -> None:
        conn, candidate = self.conn, self.candidate
        if conn is None or candidate is None or candidate[0] != conn.get_extra_info("username"):
            if conn is not None:  # never: a login succeeds only after a key's yes
                conn.disconnect(asyncssh.DISC_NO_MORE_AUTH_METHODS_AVAILABLE, "login refused")
            return
        login = candidate[1]
        refusal = self.service.logged_in(self, login.job_id)
        if refusal is not None:
            log.warning("SSH from %s to job %s refused: %s", self.address, login.job_id, refusal)
            conn.disconnect(asyncssh.DISC_TOO_MANY_CONNECTIONS, refusal)
            return
        self.login = login
        log.info("SSH login from %s to job %s.%s (%s)", self.address, login.job_id,
                 login.attempt, login.user)  # fmt: skip

    def session_requested(self) -> Any:
        login, conn = self.login, self.conn
        if login is None or conn is None:
            return False
        if not self.service.logins.still_running(login):
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_CONNECT_FAILED, f"job {login.job_id} is not running any more"
            )
        if not self.service.claim_session(login.job_id):
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_RESOURCE_SHORTAGE,
                f"at most {MAX_SESSIONS_PER_JOB} SSH sessions in a job at once",
            )
        chan = conn.create_server_channel(encoding=None)
        chan.__class__ = _BoundedEnvChannel  # the same object; one method more careful
        return chan, Session(self.service, login, self.address)

    # Forwarding of every kind: refused, and the client told so.
    def connection_requested(self, dest_host: str, dest_port: int, orig_host: str,
                             orig_port: int) -> Any:  # fmt: skip
        log.info("SSH from %s: refused a forwarding to %s:%s", self.address, dest_host, dest_port)
        raise asyncssh.ChannelOpenError(asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED,
                                        REFUSED_FORWARDING)  # fmt: skip

    def server_requested(self, listen_host: str, listen_port: int) -> Any:
        log.info("SSH from %s: refused a remote forwarding of port %s", self.address, listen_port)
        return False

    def unix_connection_requested(self, dest_path: str) -> Any:
        raise asyncssh.ChannelOpenError(asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED,
                                        REFUSED_FORWARDING)  # fmt: skip

    def unix_server_requested(self, listen_path: str) -> Any:
        return False

    def tun_requested(self, unit: int | None) -> Any:
        raise asyncssh.ChannelOpenError(asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED,
                                        "tunnels are not offered by Spur's SSH")  # fmt: skip

    def tap_requested(self, unit: int | None) -> Any:
        return self.tun_requested(unit)


__all__ = [
    "HOST_KEY_FILE",
    "MAX_SESSIONS_PER_JOB",
    "JobLogins",
    "SshService",
    "SshUnavailable",
    "advertised_address",
    "host_key",
    "public_line",
]
