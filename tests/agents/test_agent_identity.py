"""Who a job runs as: an organisation's own account, a site's mapped account, or (for an
agent that is not root and says so) the agent's user; never root."""

from __future__ import annotations

import os
import pwd

import pytest

from agents.identity import (
    ACCOUNT_MAX,
    Identities,
    IdentityRefused,
    agent_mode,
    check_tenant,
    tenant_account,
)
from tests.agents.conftest import root_only


def test_an_organisation_account_is_named_after_its_slug() -> None:
    assert tenant_account("acme") == "spur-acme"
    assert tenant_account("acme-labs_2") == "spur-acme-labs_2"


@pytest.mark.parametrize("slug", ["Acme", "a" * 40, "9lives-" + "x" * 30])
def test_a_long_or_unusual_slug_is_shortened_with_a_hash_that_keeps_it_apart(slug: str) -> None:
    name = tenant_account(slug)
    assert name.startswith("spur-") and len(name) <= ACCOUNT_MAX
    assert name == name.lower()
    assert name != tenant_account(slug + "x")
    assert name == tenant_account(slug)  # the same on every node


@pytest.mark.parametrize("bad", ["", ".", "..", "../etc", "a/b", "-x", "a b", "x" * 65])
def test_an_organisation_name_that_could_be_a_path_is_refused(bad: str) -> None:
    with pytest.raises(IdentityRefused):
        check_tenant(bad)


def test_an_agent_that_is_not_root_refuses_unless_told_it_is_personal() -> None:
    with pytest.raises(IdentityRefused, match="personal = true"):
        agent_mode(personal=False, tenancy="cloud", euid=1000)
    assert agent_mode(personal=True, tenancy="cloud", euid=1000) == "personal"
    assert agent_mode(personal=True, tenancy="site", euid=0) == "site"  # root switches


@root_only
def test_an_organisation_account_is_made_once_in_the_range_and_then_found() -> None:
    identities = Identities()
    first = identities.for_job(tenant="acme", user="alice")
    again = Identities().for_job(tenant="acme", user="bob")  # another agent of the host
    assert first == again
    entry = pwd.getpwnam("spur-acme")
    assert (entry.pw_uid, entry.pw_gid) == (first.uid, first.gid)
    assert 200000 <= first.uid <= 299999
    assert first.groups == ()


@root_only
def test_an_existing_account_outside_the_range_is_not_used() -> None:
    Identities().for_job(tenant="acme", user="alice")
    narrow = Identities(uid_range=(100, 200))
    with pytest.raises(IdentityRefused, match="outside uid_range"):
        narrow.for_job(tenant="acme", user="alice")


@root_only
def test_a_full_range_refuses_a_new_organisation() -> None:
    taken = os.getuid() or 1  # an id that exists
    identities = Identities(uid_range=(max(taken, 1), max(taken, 1)))
    with pytest.raises(IdentityRefused, match="no free id"):
        identities.for_job(tenant="never-made-full", user="alice")


@root_only
def test_site_tenancy_maps_users_to_existing_accounts_and_refuses_the_rest() -> None:
    nobody = pwd.getpwnam("nobody")
    site = Identities(tenancy="site", site_users={"alice": "nobody", "eve": "root"})
    alice = site.for_job(tenant="acme", user="alice")
    assert (alice.name, alice.uid, alice.gid) == ("nobody", nobody.pw_uid, nobody.pw_gid)
    with pytest.raises(IdentityRefused, match="no Unix account"):
        site.for_job(tenant="acme", user="bob")
    with pytest.raises(IdentityRefused, match="root"):
        site.for_job(tenant="acme", user="eve")


def test_subordinate_id_ranges_that_overlap_are_found(tmp_path: object) -> None:
    identities = Identities(personal=True) if os.geteuid() else Identities()
    found = identities.overlapping_subordinate_ids()
    assert all(line.startswith(("/etc/subuid", "/etc/subgid")) for line in found)
