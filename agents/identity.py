"""Who a job runs as: an unprivileged Unix identity, never root and never the agent's own.

The agent chooses it from its `[agent]` settings (scheduler/config.py):

- **cloud** tenancy (the default): one identity per organisation. The job's `tenant` (a
  slug) becomes the account `spur-<tenant>` (at most 32 characters: a long or unusual
  slug is shortened and given a hash), with uid = gid taken from `uid_range`. The agent
  creates the group and the account (groupadd, useradd) the first time one of the
  organisation's jobs lands on the node, under a lock (a thread lock, and a file lock
  against the other agents of the host). The first id it tries is derived from the name
  (sha256), so the nodes of a cluster usually give an organisation the same uid without
  talking to each other, which a shared file system needs; a taken id is skipped, so two
  nodes *can* disagree. Production clusters with shared storage should therefore keep
  these accounts in a directory service (LDAP, SSSD: the agent finds the account and
  creates nothing), or use site tenancy.
- **site** tenancy: platform users are mapped to existing Unix accounts
  (`[agent.site_users]`, platform user name -> account name); an unmapped user's job is
  refused. The account keeps its groups (shared project directories rely on them).
- **personal**: an agent that is not root cannot switch identity. With `personal = true`
  it runs every job, still sandboxed, as its own user (a laptop, `spurcloud up` run by a
  normal user) and says so when it starts; without it, it refuses to start.

Whatever the settings, a job that would run as uid 0 or gid 0 is refused, and the root
group is never among a job's groups.
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import hashlib
import logging
import os
import pwd
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_UID_RANGE = (200000, 299999)
# Only root may create a file in /run: another local user cannot hold this lock forever.
IDENTITY_LOCK = "/run/spurd-identity.lock"
ACCOUNT_PREFIX = "spur-"
ACCOUNT_MAX = 32  # useradd's limit on most systems
# A tenant is an organisation's slug: no dot, so never "." or "..", and no "/".
_TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_PLAIN = re.compile(r"[a-z0-9][a-z0-9_-]*")


class IdentityRefused(Exception):
    """No acceptable identity for this job on this node (the job fails with the reason)."""


@dataclass(frozen=True)
class Identity:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...] = ()  # supplementary groups, besides gid
    home: str = ""  # the account's home; the job's HOME is its workspace unless site tenancy


def tenant_account(tenant: str) -> str:
    """The account name of an organisation in cloud tenancy: `spur-<tenant>`, shortened
    with a hash when the slug is long or holds what an account name may not."""
    plain = tenant.lower()
    if plain == tenant and _PLAIN.fullmatch(plain) and len(ACCOUNT_PREFIX) + len(plain) <= 32:
        return ACCOUNT_PREFIX + plain
    digest = hashlib.sha256(tenant.encode()).hexdigest()[:8]
    keep = ACCOUNT_MAX - len(ACCOUNT_PREFIX) - 1 - len(digest)
    return f"{ACCOUNT_PREFIX}{plain[:keep]}-{digest}"


def check_tenant(tenant: str) -> str:
    if not _TENANT.fullmatch(tenant):
        raise IdentityRefused(f"invalid organisation name {tenant!r}")
    return tenant


def agent_mode(*, personal: bool, tenancy: str, euid: int | None = None) -> str:
    """How this agent gives jobs an identity: "cloud", "site" or "personal".

    Raises IdentityRefused when it cannot give them any: it is not root (so it cannot
    switch identity) and was not told that running every job as itself is intended.
    """
    euid = os.geteuid() if euid is None else euid
    if euid == 0:
        return tenancy
    if not personal:
        name = _user_name(euid)
        raise IdentityRefused(
            f"spurd runs as {name} (uid {euid}), not root, so it cannot run jobs as their "
            "organisations' identities. Run it as root, or set [agent] personal = true to run "
            "every job sandboxed as this user"
        )
    return "personal"


@dataclass
class Identities:
    """Gives each job its identity (see the module docstring)."""

    tenancy: str = "cloud"
    uid_range: tuple[int, int] = DEFAULT_UID_RANGE
    site_users: Mapping[str, str] = field(default_factory=dict)
    personal: bool = False
    lock_path: str = IDENTITY_LOCK
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _cache: dict[str, Identity] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.tenancy not in ("cloud", "site"):
            raise ValueError(f"tenancy must be 'cloud' or 'site', not {self.tenancy!r}")
        low, high = self.uid_range
        if not 0 < low <= high:
            raise ValueError(f"uid_range must be two ids, 0 < low <= high, not {self.uid_range}")
        self.mode = agent_mode(personal=self.personal, tenancy=self.tenancy)

    def for_job(self, *, tenant: str, user: str) -> Identity:
        check_tenant(tenant)
        if self.mode == "personal":
            identity = self._own()
        elif self.mode == "site":
            identity = self._site(user)
        else:
            identity = self._cloud(tenant)
        if identity.uid == 0 or identity.gid == 0:
            raise IdentityRefused(f"the job would run as root ({identity.name}): refused")
        return identity

    def overlapping_subordinate_ids(self) -> list[str]:
        """Lines of /etc/subuid and /etc/subgid whose ranges overlap `uid_range`: a user
        given those subordinate ids could become an organisation's uid in a container."""
        low, high = self.uid_range
        found = []
        for table in ("/etc/subuid", "/etc/subgid"):
            try:
                lines = Path(table).read_text().splitlines()
            except OSError:
                continue
            for line in lines:
                parts = line.split(":")
                if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
                    start, count = int(parts[1]), int(parts[2])
                    if start <= high and low < start + count:
                        found.append(f"{table}: {line}")
        return found

    # -- each mode ------------------------------------------------------------------

    def _own(self) -> Identity:
        uid, gid = os.geteuid(), os.getegid()
        try:
            entry = pwd.getpwuid(uid)
            name, home = entry.pw_name, entry.pw_dir
        except KeyError:
            name, home = str(uid), ""
        return Identity(name, uid, gid, tuple(g for g in os.getgroups() if g not in (0, gid)), home)

    def _site(self, user: str) -> Identity:
        account = self.site_users.get(user)
        if not account:
            raise IdentityRefused(
                f"user {user!r} has no Unix account on this node ([agent.site_users])"
            )
        try:
            entry = pwd.getpwnam(account)
        except KeyError:
            raise IdentityRefused(
                f"the Unix account {account!r} of user {user!r} does not exist"
            ) from None
        listed = os.getgrouplist(account, entry.pw_gid)
        groups = tuple(g for g in listed if g not in (0, entry.pw_gid))
        return Identity(account, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir)

    def _cloud(self, tenant: str) -> Identity:
        name = tenant_account(tenant)
        cached = self._cache.get(name)
        if cached is not None:
            return cached
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            entry = self._create(name, tenant)
        low, high = self.uid_range
        if not (low <= entry.pw_uid <= high and low <= entry.pw_gid <= high):
            raise IdentityRefused(
                f"the account {name} exists with uid {entry.pw_uid} gid {entry.pw_gid}, outside "
                f"uid_range {low}-{high}: spurd did not make it and will not use it"
            )
        identity = Identity(name, entry.pw_uid, entry.pw_gid, (), entry.pw_dir)
        self._cache[name] = identity
        return identity

    def _create(self, name: str, tenant: str) -> pwd.struct_passwd:
        for tool in ("groupadd", "useradd"):
            if shutil.which(tool) is None:
                raise IdentityRefused(f"cannot create the account {name}: {tool} is not installed")
        with self._lock, _file_lock(self.lock_path):
            with contextlib.suppress(KeyError):
                return pwd.getpwnam(name)  # another agent of this host made it meanwhile
            low, high = self.uid_range
            span = high - low + 1
            start = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") % span
            for step in range(span):
                candidate = low + (start + step) % span
                if _taken(pwd.getpwuid, candidate):
                    continue
                group = _entry(grp.getgrnam, name)
                if group is None:
                    if _taken(grp.getgrgid, candidate) or not _run(
                        ["groupadd", "-g", str(candidate), name]
                    ):
                        continue
                    gid = candidate
                else:
                    gid = group.gr_gid  # left by an earlier attempt: reuse it
                if _run(
                    [
                        "useradd",
                        "-u", str(candidate),
                        "-g", str(gid),
                        "-M",  # no home is made: the job's home is its workspace
                        "-N",
                        "-s", _nologin(),
                        "-d", "/nonexistent",
                        "-c", f"Spur-Cloud organisation {tenant}",
                        # No subordinate ids: they would let the account map other uids.
                        "-K", "SUB_UID_COUNT=0",
                        "-K", "SUB_GID_COUNT=0",
                        name,
                    ]
                ):  # fmt: skip
                    entry = pwd.getpwnam(name)
                    log.info("created the account %s (uid %d) for %s", name, entry.pw_uid, tenant)
                    return entry
                with contextlib.suppress(KeyError):
                    return pwd.getpwnam(name)
            raise IdentityRefused(f"no free id left in uid_range {low}-{high} for {name}")


def _run(argv: list[str]) -> bool:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        log.warning("%s failed (%d): %s", argv[0], result.returncode, result.stderr.strip())
    return result.returncode == 0


def _taken(lookup: object, ident: int) -> bool:
    try:
        lookup(ident)  # type: ignore[operator]
    except KeyError:
        return False
    return True


def _entry(lookup: object, name: str) -> grp.struct_group | None:
    try:
        entry: grp.struct_group = lookup(name)  # type: ignore[operator]
    except KeyError:
        return None
    return entry


def _nologin() -> str:
    for shell in ("/usr/sbin/nologin", "/sbin/nologin", "/bin/false"):
        if os.path.exists(shell):
            return shell
    return "/bin/false"


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


@contextlib.contextmanager
def _file_lock(path: str) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
