"""Per-session terminal tokens: what lets a browser's terminal reach a PTY in a job.

The web terminal (an interactive session's, docs/architecture.md "Interactive sessions")
is a PTY that the agent opens inside the job's sandbox. The agent must open one only for
a request the controller allowed, for that job, its organisation and its user, for a
short while. The leader mints the token as it signs launches: with the node's credential
(`signatures.node_key`), over (job, attempt, node, tenant, user, a nonce, expiry); the
web never holds a key, and the agent checks the token with its own credential against
the job it runs. A token made for another node, job, attempt or organisation, altered,
forged without the key, or expired, is refused (401).

Format: `spur-term.<base64url JSON fields>.<hex HMAC-SHA256>`.

The same token, with the kind `spur-svc` in place of `spur-term` (in the text and under
the MAC), lets the web reach the HTTP service of a session (its JupyterLab) through the
agent's proxy (agents/service_proxy.py). The kinds are apart so that a terminal token
cannot be replayed at the proxy, nor a proxy token open a shell.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from collections.abc import Mapping
from typing import Any

from scheduler.rpc.errors import Unauthorized

PREFIX = "spur-term"
SERVICE = "spur-svc"  # the kind of a session service proxy's token
_KINDS = {PREFIX: "terminal", SERVICE: "service"}
TTL_S = 60.0  # long enough to open the websocket; a reconnection asks for a new one
MAX_TOKEN_CHARS = 1200
FIELDS = ("job_id", "attempt", "node", "tenant", "user", "nonce", "expires")


def _mac(credential: bytes, body: str, kind: str = PREFIX) -> str:
    return hmac.new(credential, f"{kind}:{body}".encode(), hashlib.sha256).hexdigest()


def mint(
    credential: bytes,
    *,
    job_id: int,
    attempt: int,
    node: str,
    tenant: str,
    user: str,
    now: float,
    ttl_s: float = TTL_S,
    kind: str = PREFIX,
) -> str:
    """A token for one terminal (or, of kind SERVICE, the service) of one job attempt on
    `node` (its credential)."""
    fields = {
        "job_id": job_id,
        "attempt": attempt,
        "node": node,
        "tenant": tenant,
        "user": user,
        "nonce": secrets.token_hex(8),
        "expires": int(now + ttl_s),
    }
    raw = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    body = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    return f"{kind}.{body}.{_mac(credential, body, kind)}"


def check(
    credential: bytes,
    token: str,
    *,
    node: str,
    jobs: Mapping[int, tuple[int, str]],
    now: float,
    kind: str = PREFIX,
) -> dict[str, Any]:
    """The token's fields when this node's credential made it, for this node, unexpired,
    and for a job this node runs (`jobs`: job id -> (attempt, tenant)) in that attempt and
    organisation. Unauthorized otherwise, with no detail a forger could use beyond why."""
    what = _KINDS[kind]
    parts = token.split(".") if isinstance(token, str) and len(token) <= MAX_TOKEN_CHARS else []
    if len(parts) != 3 or parts[0] != kind:
        raise Unauthorized(f"not a {what} token")
    _, body, mac = parts
    if not hmac.compare_digest(_mac(credential, body, kind).encode(), mac.encode()):
        raise Unauthorized(f"invalid {what} token")
    try:
        fields = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    except ValueError as exc:  # only this node's credential could have made it: a bug
        raise Unauthorized(f"invalid {what} token") from exc
    if not isinstance(fields, dict) or sorted(fields) != sorted(FIELDS):
        raise Unauthorized(f"invalid {what} token")
    if fields["node"] != node:
        raise Unauthorized(f"this {what} token is for another node")
    if now > fields["expires"]:
        raise Unauthorized(f"{what} token expired")
    running = jobs.get(fields["job_id"])
    if running is None or running[0] != fields["attempt"]:
        raise Unauthorized(f"job {fields['job_id']} does not run here")
    if running[1] != fields["tenant"]:
        raise Unauthorized(f"this {what} token is another organisation's")
    return fields


__all__ = ["MAX_TOKEN_CHARS", "PREFIX", "SERVICE", "TTL_S", "check", "mint"]
