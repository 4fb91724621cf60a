"""Verified API tokens, kept a few seconds in the process (`API_TOKEN_CACHE_S`).

Every API request looked its token up: one query joining the token, its user, its
organisation, the membership and the confirmed address, about a tenth of a submission's
CPU in the web process. A client sends the same token many times a second, so the row is
kept here, keyed by the secret's hash, for `API_TOKEN_CACHE_S` seconds (0: not kept);
every check that authentication makes (revoked, expired, the user active and a member,
the address confirmed) still runs on it at each request.

A change made elsewhere (a token revoked in another web process, a member removed
there) takes effect here within that bound; one made in this process takes effect at
once: the services that revoke tokens forget them on commit, and a save or delete of a
token, a user, a membership, an organisation or an address forgets them all (a few
entries a process: cheaper to drop than to track).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from allauth.account.models import EmailAddress
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models.signals import post_delete, post_save

from spurcloud.tenants import tokens
from spurcloud.tenants.models import ApiToken, Membership, Organization
from spurcloud.tenants.selectors import api_token_for_secret

if TYPE_CHECKING:
    from spurcloud.tenants.selectors import AnnotatedApiToken

clock = time.monotonic  # the tests move it on
_lock = threading.Lock()
_kept: dict[str, tuple[float, AnnotatedApiToken]] = {}  # secret's hash -> (until, token)
_MAX_KEPT = 10_000  # beyond it, forget all: a flood of distinct secrets cannot grow it


def api_token_for_secret_kept(secret: str) -> AnnotatedApiToken | None:
    """`api_token_for_secret(secret)`, from this process's memory when it was read less
    than `API_TOKEN_CACHE_S` ago. Only a token found is kept (a wrong secret costs a
    query each time, and the per-address rate limit comes before it)."""
    keep_s = float(settings.API_TOKEN_CACHE_S)
    if keep_s <= 0:
        return api_token_for_secret(secret)
    now = clock()
    token_hash = tokens.hash_secret(secret)
    kept = _kept.get(token_hash)
    if kept is not None and kept[0] > now:
        return kept[1]
    token = api_token_for_secret(secret)
    if token is not None:
        with _lock:
            if len(_kept) >= _MAX_KEPT:
                _kept.clear()
            _kept[token_hash] = (now + keep_s, token)
    return token


def forget_api_tokens(**_: Any) -> None:
    """Drops every kept token: the next request of each reads its row again."""
    with _lock:
        _kept.clear()


for model in (ApiToken, Membership, Organization, EmailAddress, get_user_model()):
    post_save.connect(forget_api_tokens, sender=model, dispatch_uid=f"token_cache:{model}:save")
    post_delete.connect(forget_api_tokens, sender=model, dispatch_uid=f"token_cache:{model}:del")
