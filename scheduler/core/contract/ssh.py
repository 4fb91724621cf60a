"""SSH into a running job: the facts the portal, the controller's log and the agent share.

A job may carry `ssh_keys` (spec.py): OpenSSH public key lines, `<type> <base64>` as
authorized_keys holds them, without options or comment. The platform stamps them from
the submitter's account (the portal's session launch); the agent that runs the job's
batch script lets in, as the job's identity and in a sandbox of the job's, whoever
proves they hold one of them (agents/ssh.py). They are fixed at submit: a key removed
from the account later still opens the jobs that carry it, until they end.

A client logs in as `job-<id>` (`login_name`), to the node's SSH address, which the
agent reports at registration in its node's labels with its host key
(`ADDRESS_LABEL`, `HOST_KEY_LABEL`), so that the portal can show the command and the
known_hosts line.

Only the line's form is checked here (the core reads no key material): its type is one
of `KEY_TYPES`, its data is base64 whose first field names that same type, and it is
bounded. Whether the key itself is sound is the account page's check
(spurcloud/tenants/sshkeys.py, with `cryptography`) and the agent's (asyncssh).
"""

from __future__ import annotations

import base64
import binascii
import re

from scheduler.core.errors import InvalidSpec

# Ed25519, ECDSA (NIST curves) and RSA: what the account page accepts.
KEY_TYPES = (
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "ssh-rsa",
)
MAX_KEYS = 20  # an account's keys (tenants.models.MAX_SSH_KEYS_PER_USER) all fit
MAX_KEY_LINE = 4096  # a 16384-bit RSA key's line is about 2.8 KB
LOGIN_PREFIX = "job-"
ADDRESS_LABEL = "spur.ssh"  # "host:port" clients dial
HOST_KEY_LABEL = "spur.ssh_host_key"  # the agent's host key, "<type> <base64>"
_LOGIN = re.compile(r"job-([1-9][0-9]{0,17})")
_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")


def key_line_problem(line: str) -> str | None:
    """Why `line` is not an OpenSSH public key line of the accepted form, or None."""
    if len(line) > MAX_KEY_LINE:
        return f"a key line is at most {MAX_KEY_LINE} characters"
    parts = line.split(" ")
    if len(parts) != 2:
        return "a key is '<type> <base64>', without options or comment"
    key_type, data = parts
    if key_type not in KEY_TYPES:
        return f"key type {key_type[:40]!r} is not one of {', '.join(KEY_TYPES)}"
    if not _BASE64.fullmatch(data):
        return "the key's data is not base64"
    try:
        blob = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return "the key's data is not base64"
    name = key_type.encode()
    # The blob names its own type first: a label that lies about it is refused.
    if int.from_bytes(blob[:4], "big") != len(name) or blob[4 : 4 + len(name)] != name:
        return f"the key's data is not a {key_type} key"
    return None


def check_keys(keys: tuple[str, ...], field: str = "ssh_keys") -> None:
    """InvalidSpec naming the first bad line of `keys` (or a repeated one)."""
    for index, line in enumerate(keys):
        problem = key_line_problem(line)
        if problem is not None:
            raise InvalidSpec(f"{field}[{index}]: {problem}", field=field)
    if len(set(keys)) != len(keys):
        raise InvalidSpec(f"{field}: a key is listed twice", field=field)


def login_name(job_id: int) -> str:
    """The user name a client logs in with to reach job `job_id`."""
    return f"{LOGIN_PREFIX}{job_id}"


def job_of_login(name: str) -> int | None:
    """The job id a login name names, or None for a name that is not `job-<id>`."""
    found = _LOGIN.fullmatch(name)
    return int(found.group(1)) if found else None


__all__ = [
    "ADDRESS_LABEL",
    "HOST_KEY_LABEL",
    "KEY_TYPES",
    "LOGIN_PREFIX",
    "MAX_KEYS",
    "MAX_KEY_LINE",
    "check_keys",
    "job_of_login",
    "key_line_problem",
    "login_name",
]
