"""SSH into a session: the keys a session takes at launch, and the connection details its
page shows (templates/portal/_session_ssh.html).

A session's job carries its launcher's account SSH keys (`ssh_keys`, the contract's
scheduler/core/contract/ssh.py), read when it is launched and fixed from then on: a key
added later opens the sessions launched after, a key removed later still opens the
sessions that carry it until they end. The agent of the session's node lets in whoever
holds one of them, as `job-<id>`, when it offers SSH (agents/ssh.py); it says so, with
the address to dial and its host key, in its node's labels.

Who sees the details: the session's own user (their keys open it), and owners and admins
(who may enter through the web terminal, and are told whose keys SSH takes). A member in
another's session and a billing member see none, as they get no terminal."""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass
from typing import Any

from scheduler.core.contract import JobState
from scheduler.core.contract import ssh as contract
from scheduler.rpc.errors import RpcError
from spurcloud.jobs.controller import controller_client
from spurcloud.jobs.models import JobRecord
from spurcloud.tenants.models import Membership, SshKey

# What a node may say its address is: a host name or an IP address, and a port.
_ADDRESS = re.compile(r"\[?(?P<host>[A-Za-z0-9.:-]{1,253})\]?:(?P<port>[0-9]{1,5})")


def launch_keys(user: Any) -> list[str]:
    """The keys a session launched now by `user` takes: their account's, newest first."""
    keys = SshKey.objects.filter(user=user).order_by("-created_at", "-id")
    return list(keys.values_list("public_key", flat=True)[: contract.MAX_KEYS])


@dataclass(frozen=True)
class NodeSsh:
    host: str
    port: int
    host_key: str  # "<type> <base64>"

    @property
    def known_hosts(self) -> str:
        """The line for ~/.ssh/known_hosts (with the port, as ssh looks it up)."""
        name = self.host if self.port == 22 else f"[{self.host}]:{self.port}"
        return f"{name} {self.host_key}"

    @property
    def fingerprint(self) -> str:
        """What ssh prints when it asks to trust the host (SHA256, as ssh-keygen -l)."""
        digest = hashlib.sha256(base64.b64decode(self.host_key.split(" ")[1])).digest()
        return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")

    def command(self, job_id: int) -> str:
        port = "" if self.port == 22 else f"-p {self.port} "
        return f"ssh {port}{contract.login_name(job_id)}@{self.host}"


def node_ssh(labels: Any) -> NodeSsh | None:
    """A node's SSH as its agent reported it, or None (it offers none, or says nonsense)."""
    if not isinstance(labels, dict):
        return None
    address, host_key = labels.get(contract.ADDRESS_LABEL), labels.get(contract.HOST_KEY_LABEL)
    if not isinstance(address, str) or not isinstance(host_key, str):
        return None
    found = _ADDRESS.fullmatch(address)
    if found is None or not 0 < int(found["port"]) < 65536:
        return None
    if contract.key_line_problem(host_key) is not None:
        return None
    return NodeSsh(found["host"], int(found["port"]), host_key)


def _node(name: str) -> NodeSsh | None:
    try:
        nodes = controller_client().nodes()
    except RpcError:
        return None  # the page says nothing of SSH while the controller cannot be asked
    for node in nodes:
        if node.get("name") == name:
            return node_ssh(node.get("labels"))
    return None


def ssh_activity(records: list[JobRecord]) -> dict[int, float]:
    """When SSH last relayed a byte in each of these sessions, as their nodes' agents say
    (`GET /v1/jobs/{id}/ssh`); a session whose node cannot say is left out."""
    records = [r for r in records if r.nodes]
    if not records:
        return {}
    try:
        urls = {n.get("name"): n.get("agent_url") for n in controller_client().nodes()}
    except RpcError:
        return {}
    # Imported here: tasks imports the services, which import the selectors.
    from spurcloud.jobs.tasks import agent_client

    found: dict[int, float] = {}
    for record in records:
        url = urls.get(str(record.nodes[0]))
        if not url:
            continue
        try:
            answer = agent_client(str(url)).ssh_activity(record.job_id)
        except RpcError:
            continue
        at = answer.get("active_at")
        if isinstance(at, int | float) and not isinstance(at, bool):
            found[record.job_id] = float(at)
    return found


def ssh_details(*, membership: Membership, record: JobRecord) -> dict[str, Any] | None:
    """What the session's page says about SSH, for this viewer; None: nothing."""
    if not membership.runs_jobs:
        return None
    own = record.user == membership.user.get_username()
    if not (own or membership.manages_organization):
        return None
    if record.state != JobState.RUNNING.value or not record.nodes:
        return None
    node = _node(str(record.nodes[0]))
    if node is None:
        return None
    keys = list((record.spec or {}).get("ssh_keys") or [])
    return {
        "own": own,
        "user": record.user,
        "keys": len(keys),
        "command": node.command(record.job_id),
        "known_hosts": node.known_hosts,
        "fingerprint": node.fingerprint,
    }


__all__ = ["NodeSsh", "launch_keys", "node_ssh", "ssh_activity", "ssh_details"]
