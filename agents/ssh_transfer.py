"""Copying files over SSH into a job (sftp, scp, rsync -e ssh): which of the node's own
programs serve them, run in the job's sandbox as every SSH session is (ssh_session.py).

    sftp, scp (OpenSSH 9)  ─ the `sftp` subsystem ─▶ OpenSSH's sftp-server, in the sandbox
    scp -O (legacy)        ─ exec `scp -t|-f ...` ─▶ the node's scp, in the sandbox
    rsync -e ssh           ─ exec `rsync --server` ─▶ the node's rsync, in the sandbox

None of them is served by the agent itself: the agent runs privileged, and a file server
in its own process would see the host, held back only by a path check, which is one bug
away from a tenant reading the host. The sandbox's program sees what the job sees (the
workspace, a private /tmp, the system read-only) and acts as the job's identity, so the
kernel is the check: what the job cannot reach, no transfer reaches.

They are the node's programs, found in the system directories that every sandbox shows
read-only at the same paths (sandbox.SYSTEM_DIRS). One that is missing is said once when
the SSH server starts, and to each client that asks for it (the rest of SSH works on):
`sftp-server` comes with openssh-sftp-server (Debian, Ubuntu) or openssh-server
(RHEL, Fedora, SUSE), `scp` with openssh-client, `rsync` with rsync.
"""

from __future__ import annotations

import os
import stat

from agents.sandbox import SYSTEM_DIRS

SFTP_SUBSYSTEM = "sftp"
# Where distributions put OpenSSH's sftp-server: Debian and Ubuntu; RHEL, Fedora and
# SUSE; Arch and Alpine; older SUSE.
SFTP_SERVERS = (
    "/usr/lib/openssh/sftp-server",
    "/usr/libexec/openssh/sftp-server",
    "/usr/lib/ssh/sftp-server",
    "/usr/libexec/ssh/sftp-server",
)
# The commands a transfer client runs on the far side, and who provides them: found in
# the directories of a job's PATH that every sandbox shows.
TOOL_DIRS = ("/usr/local/bin", "/usr/bin", "/bin")
TOOLS = {"scp": "openssh-client", "rsync": "rsync"}
MISSING_SFTP = (
    "SFTP (sftp, and scp, which uses it) is not offered on this node: OpenSSH's "
    "sftp-server is not installed (apt-get install openssh-sftp-server, "
    "dnf install openssh-server)"
)


class TransferUnavailable(Exception):
    """A transfer the node cannot serve: its program is not installed (the client is told)."""


def sftp_server() -> str | None:
    """The sftp-server the sandbox runs, or None where the node has none."""
    return next((path for path in SFTP_SERVERS if _runnable(path)), None)


def tool(name: str) -> str | None:
    """Where a sandbox finds the node's `name` (scp, rsync), or None."""
    return next((f"{d}/{name}" for d in TOOL_DIRS if _runnable(f"{d}/{name}")), None)


def missing_tool(command: str) -> str | None:
    """Why a command that serves a transfer cannot run here (legacy scp's `scp -t|-f`,
    rsync's `rsync --server`) when the node lacks that program; None for anything else,
    which runs as it is (a shell says "command not found" as on any host). A tool given
    by its path, or from the job's own PATH, is the job's business: only the bare names
    a client sends by default are recognised."""
    words = command.split()
    if not words:
        return None
    name = words[0]
    if name == "scp" and ("-t" in words or "-f" in words):
        what = "scp -O (the legacy SCP protocol)"
        hint = "; scp without -O uses SFTP" if sftp_server() is not None else ""
    elif name == "rsync" and words[1:2] == ["--server"]:
        what, hint = "rsync over SSH", ""
    else:
        return None
    if tool(name) is not None:
        return None
    return f"{what} needs {name} on this node, which is not installed ({TOOLS[name]}){hint}"


def offered() -> dict[str, str | None]:
    """What this node serves of each way to copy files (for the agent's start-up log)."""
    return {
        "sftp": sftp_server(),
        "scp -O": tool("scp"),
        "rsync": tool("rsync"),
    }


def _runnable(path: str) -> bool:
    """A regular file that anyone may execute (a job's identity runs it), which a sandbox
    shows at the same path (under a system directory, links resolved)."""
    real = os.path.realpath(path)
    if not any(real == d or real.startswith(d + "/") for d in SYSTEM_DIRS):
        return False
    try:
        info = os.stat(real)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and bool(info.st_mode & stat.S_IXOTH)


__all__ = [
    "MISSING_SFTP",
    "SFTP_SERVERS",
    "SFTP_SUBSYSTEM",
    "TransferUnavailable",
    "missing_tool",
    "offered",
    "sftp_server",
    "tool",
]
