"""One SSH session channel in a job (agents/ssh.py has the server, its logins and bounds):
a shell, a command or the SFTP subsystem started in the job's sandbox as the web
terminal's shell is (`StepRunner.start_shell`), its bytes relayed both ways, its exit
status (or signal) sent back, and everything it started killed when either side ends.

    client ─ channel ─▶ Session ─▶ PTY master (shell with a terminal), or three pipes
                                   (a command's or sftp-server's stdin, stdout, stderr)
                                   ─▶ the sandbox

SFTP is OpenSSH's sftp-server run in the sandbox on the channel's pipes, as sshd runs it
(agents/ssh_transfer.py says why never a server of the agent's own): a command whose
program the agent picks, no shell in between.

Flow control both ways: output is no longer read while the channel's send buffer is
full (`pause_writing`), and input is no longer taken from the client (the channel's
window stays shut, `pause_reading`) while the shell does not read what it was given.
Everything runs on the server's loop; only a sandbox's start and end block (on the
server's threads), and a shell's end is awaited on a pidfd, not by a waiting thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import re
import shutil
import signal as signals
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import asyncssh

from agents import ssh_transfer as transfer
from agents.launch_request import InvalidLaunch, LaunchError
from agents.step_io import set_size
from agents.steps import StepRefused, StepRun
from agents.terminal import SETSID

if TYPE_CHECKING:
    from agents.ssh import SshService

log = logging.getLogger(__name__)

MAX_COMMAND = 128 * 1024  # Linux's MAX_ARG_STRLEN
MAX_INPUT_BUFFER = 256 * 1024  # input held for a shell that does not read yet
READ_CHUNK = 32 * 1024
DRAIN_S = 2.0  # how long the last output may take once the shell has ended
DEFAULT_TERM = "xterm-256color"
_TERM = re.compile(r"[A-Za-z0-9._+-]{1,64}")
_PASSED_ENV = re.compile(r"LANG|LC_[A-Z]{1,32}")
_ENV_VALUE = re.compile(r"[\x20-\x7e]{0,256}")
_SIGNALS = {"INT": signals.SIGINT, "TERM": signals.SIGTERM, "HUP": signals.SIGHUP,
            "QUIT": signals.SIGQUIT, "KILL": signals.SIGKILL, "USR1": signals.SIGUSR1,
            "USR2": signals.SIGUSR2}  # fmt: skip


@dataclass(frozen=True)
class Login:
    """A job a client may log in to: the attempt running here and who submitted it."""

    job_id: int
    attempt: int
    user: str


class Session(asyncssh.SSHServerSession):  # type: ignore[type-arg]
    """One session channel: a shell or a command in the job, relayed both ways. Runs on
    the service's loop; only starting and ending the sandbox block (its executor)."""

    def __init__(self, service: SshService, login: Login, address: str) -> None:
        self.service = service
        self.login = login
        self.address = address
        self.chan: Any = None
        self.term: str | None = None
        self.size = (80, 24)
        self.command: str | None = None
        self.subsystem: str | None = None
        self.run: StepRun | None = None
        self.fds: set[int] = set()  # every descriptor this session owns, closed once
        self.input_fd = -1  # the PTY's master, or the command's stdin pipe
        self.outputs: dict[int, bool] = {}  # fd -> whether it is stderr
        self.pending = bytearray()  # input not yet written to the shell
        self.eof = False
        self.paused = False
        self.outputs_done = asyncio.Event()
        self.released = False
        self.exited = False
        self.run_ended = False

    # -- what the client asks ---------------------------------------------------------

    def connection_made(self, chan: Any) -> None:
        self.chan = chan
        self.service.open_sessions.add(self)

    def pty_requested(self, term_type: str, term_size: tuple[int, int, int, int],
                      term_modes: Mapping[int, int]) -> bool:  # fmt: skip
        self.term = term_type if _TERM.fullmatch(term_type or "") else DEFAULT_TERM
        self.size = _size(term_size[0], term_size[1])
        return True

    def shell_requested(self) -> bool:
        return True

    def exec_requested(self, command: str) -> bool:
        if len(command.encode()) > MAX_COMMAND or "\x00" in command:
            log.info("SSH in job %s: refused a command of %d bytes", self.login.job_id,
                     len(command))  # fmt: skip
            return False
        self.command = command
        return True

    def subsystem_requested(self, subsystem: str) -> bool:
        if subsystem != transfer.SFTP_SUBSYSTEM:
            log.info("SSH in job %s: refused the subsystem %r", self.login.job_id,
                     subsystem[:40])  # fmt: skip
            return False
        self.subsystem = subsystem
        self.term = None  # a binary protocol: pipes, even where a client asked for a PTY
        return True

    def break_received(self, msec: int) -> bool:
        return False

    def session_started(self) -> None:
        self.service.track(asyncio.ensure_future(self._serve()))

    def terminal_size_changed(self, width: int, height: int, pixwidth: int,
                              pixheight: int) -> None:  # fmt: skip
        self.size = _size(width, height)
        if self.term is not None and self.input_fd in self.fds:
            with contextlib.suppress(OSError):
                set_size(self.input_fd, *self.size)

    def signal_received(self, signal: str) -> None:
        signum = _SIGNALS.get(signal)
        if signum is not None and self.run is not None and not self.run_ended:
            self.run.signal(signum)

    def data_received(self, data: bytes, datatype: Any) -> None:
        self.service.note_activity(self.login.job_id)
        self.pending += data
        self._flush_input()

    def eof_received(self) -> bool:
        if self.term is None:  # a command's stdin ends (a terminal has no such end)
            self.eof = True
            self._flush_input()
        return True  # the channel stays open for the output and the exit status

    def pause_writing(self) -> None:
        self.paused = True
        loop = asyncio.get_running_loop()
        for fd in self.outputs:
            loop.remove_reader(fd)

    def resume_writing(self) -> None:
        self.paused = False
        loop = asyncio.get_running_loop()
        for fd in self.outputs:
            loop.add_reader(fd, self._readable, fd)

    def connection_lost(self, exc: Exception | None) -> None:
        self.service.track(asyncio.ensure_future(self.finish()))

    # -- the shell ------------------------------------------------------------------------

    async def _serve(self) -> None:
        try:
            await self._start()
        except transfer.TransferUnavailable as exc:
            log.warning("SSH in job %s: refused: %s", self.login.job_id, exc)
            self._say(f"spurd: {exc}")
            self._exit(127, 0)  # as a shell answers a command it does not find
            await self.finish()
            return
        except (StepRefused, InvalidLaunch, LaunchError, OSError, ValueError) as exc:
            log.warning("SSH in job %s: could not start: %s", self.login.job_id, exc)
            self._say(f"spurd: cannot start {self._what()} in job {self.login.job_id}: {exc}")
            self._exit(255, 0)
            await self.finish()
            return
        if self.released:  # the client left while the sandbox started
            await self._end_run()
            return
        log.info("SSH into job %s.%s: %s for %s from %s", self.login.job_id,
                 self.login.attempt, self._what(), self.login.user, self.address)  # fmt: skip
        run = self.run
        assert run is not None
        await _exited(run)
        status = self.service.launcher.steps.wait_shell(run)  # it has ended: no wait
        await self._end_run()  # what the shell left running dies, letting go of output
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.outputs_done.wait(), DRAIN_S)
        self._exit(*status)
        await self.finish()

    async def _start(self) -> None:
        if not self.service.logins.still_running(self.login):
            raise StepRefused(f"job {self.login.job_id} is not running any more")
        argv = self._argv()
        env = _environment(self.chan.get_environment(), self.term, self.login, self.chan)
        steps = self.service.launcher.steps
        job_id, attempt = self.login.job_id, self.login.attempt
        theirs: tuple[int, ...]
        # Ours are non-blocking from the start; the input is written only once the shell
        # runs (until then it is held), so nothing here ever blocks the loop.
        if self.term is not None:
            master, slave = os.openpty()
            self._own(master)
            set_size(master, *self.size)
            ours, outputs, theirs = master, {master: False}, (slave,)
            start = functools.partial(steps.start_shell, job_id, attempt, argv=argv, env=env,
                                      tty=slave)  # fmt: skip
        else:
            stdin_r, stdin_w = os.pipe2(os.O_CLOEXEC)
            out_r, out_w = os.pipe2(os.O_CLOEXEC)
            err_r, err_w = os.pipe2(os.O_CLOEXEC)
            for fd in (stdin_w, out_r, err_r):
                self._own(fd)
            ours, outputs, theirs = stdin_w, {out_r: False, err_r: True}, (stdin_r, out_w, err_w)
            start = functools.partial(steps.start_shell, job_id, attempt, argv=argv, env=env,
                                      stdio=theirs)  # fmt: skip
        for fd in self.fds:
            os.set_blocking(fd, False)
        try:
            self.run = await self.service.blocking(start)
        finally:
            for fd in theirs:  # the sandbox holds its own copies now (or failed)
                os.close(fd)
        if self.released:
            return
        self.input_fd, self.outputs = ours, outputs
        if not self.paused:
            loop = asyncio.get_running_loop()
            for fd in self.outputs:
                loop.add_reader(fd, self._readable, fd)
        self._flush_input()

    def _argv(self) -> list[str]:
        """What the session runs in the sandbox, or TransferUnavailable (the client is
        told) for a transfer whose program this node lacks."""
        if self.subsystem is not None:
            server = transfer.sftp_server()
            if server is None:
                raise transfer.TransferUnavailable(transfer.MISSING_SFTP)
            return [server]
        if self.command is not None:
            missing = transfer.missing_tool(self.command)
            if missing is not None:
                raise transfer.TransferUnavailable(missing)
        return shell_argv(self.command, tty=self.term is not None)

    def _what(self) -> str:
        if self.subsystem is not None:
            return "SFTP"
        return "a shell" if self.command is None else "a command"

    def _own(self, fd: int) -> None:
        self.fds.add(fd)

    def _close(self, fd: int) -> None:
        """Close one of ours, once: a number closed twice may be another thread's file."""
        if fd not in self.fds:
            return
        self.fds.discard(fd)
        loop = asyncio.get_running_loop()
        loop.remove_reader(fd)
        loop.remove_writer(fd)
        with contextlib.suppress(OSError):
            os.close(fd)

    def _readable(self, fd: int) -> None:
        try:
            chunk = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:  # EIO: every slave side of the terminal is closed
            chunk = b""
        if chunk:
            (self.chan.write_stderr if self.outputs.get(fd) else self.chan.write)(chunk)
            self.service.note_activity(self.login.job_id)
            return
        self.outputs.pop(fd, None)
        self._close(fd)
        if not self.outputs:
            self.outputs_done.set()

    def _flush_input(self) -> None:
        if self.input_fd not in self.fds:
            if self.run is not None or self.released:
                self.pending.clear()  # the shell is gone: what it did not read is dropped
            elif len(self.pending) >= MAX_INPUT_BUFFER:
                self.chan.pause_reading()  # not started yet: held, and bounded
            return
        loop = asyncio.get_running_loop()
        while self.pending:
            try:
                written = os.write(self.input_fd, self.pending)
            except BlockingIOError:
                # The shell reads slower than the client types: nothing more is taken
                # from the client (its window stays shut) until the shell has read this.
                self.chan.pause_reading()
                loop.add_writer(self.input_fd, self._flush_input)
                return
            except OSError:
                self.pending.clear()
                break
            del self.pending[:written]
        loop.remove_writer(self.input_fd)
        if self.eof and self.term is None:
            self._close(self.input_fd)
        self.chan.resume_reading()

    def _say(self, line: str) -> None:
        end = "\r\n" if self.term is not None else "\n"
        with contextlib.suppress(Exception):
            self.chan.write_stderr((line + end).encode())

    def _exit(self, exit_code: int, signum: int) -> None:
        if self.exited:
            return
        self.exited = True
        with contextlib.suppress(Exception):
            if signum:
                self.chan.exit_with_signal(signals.Signals(signum).name.removeprefix("SIG"))
            else:
                self.chan.exit(exit_code)

    async def _end_run(self) -> None:
        if self.run is None or self.run_ended:
            return
        self.run_ended = True
        await self.service.blocking(functools.partial(self.service.launcher.steps.end, self.run))
        log.info("SSH session in job %s.%s ended", self.login.job_id, self.login.attempt)

    async def finish(self) -> None:
        """Kill what is left and let go of everything (once; on any end)."""
        if self.released:
            return
        self.released = True
        self.service.open_sessions.discard(self)
        self.service.release_session(self.login.job_id)
        await self._end_run()
        for fd in list(self.fds):
            self._close(fd)
        self.outputs.clear()
        with contextlib.suppress(Exception):
            self.chan.close()


async def _exited(run: StepRun) -> None:
    """Until the shell's supervisor has exited, without a thread waiting for it."""
    pidfd = os.pidfd_open(run.tasks[0].process.monitor_pid)
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def ended() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(pidfd, ended)
    try:
        await done
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)


def shell_argv(command: str | None, *, tty: bool) -> list[str]:
    """What a session runs: with a terminal, its own session with the PTY as its
    controlling terminal (as the web terminal's shell); a login shell's /etc/profile
    would reset PATH and hide srun, so `bash -i` (or `bash -c` for a command)."""
    bash = shutil.which("bash") or "/bin/sh"
    inner = [bash, "-i"] if command is None else [bash, "-c", command]
    if tty:
        return [SETSID, "--ctty", "--wait", *inner]
    return [bash, "-s"] if command is None else inner


def _environment(
    sent: Mapping[str, str], term: str | None, login: Login, chan: Any
) -> dict[str, str]:
    """The session's additions to the job's environment: the terminal type, the client's
    locale (the rest it sends is dropped, as sshd's AcceptEnv does), who logged in."""
    env = {
        key: value
        for key, value in sent.items()
        if _PASSED_ENV.fullmatch(key) and _ENV_VALUE.fullmatch(value)
    }
    if term is not None:
        env["TERM"] = term
    env["SPUR_USER"] = login.user
    peer = chan.get_extra_info("peername") or ("", 0)
    sock = chan.get_extra_info("sockname") or ("", 0)
    env["SSH_CONNECTION"] = f"{peer[0]} {peer[1]} {sock[0]} {sock[1]}"
    return env


def _size(cols: int, rows: int) -> tuple[int, int]:
    return (min(max(cols, 1), 1000) if cols else 80, min(max(rows, 1), 1000) if rows else 24)


__all__ = ["DEFAULT_TERM", "MAX_COMMAND", "Login", "Session", "shell_argv"]
