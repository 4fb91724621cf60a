"""Who a portal page is for: a signed-in user, and the membership of the organisation the
portal shows (chosen in the session, re-checked on every request: selection.py)."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import TYPE_CHECKING, Concatenate, ParamSpec

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponseBase
from django.shortcuts import redirect

from spurcloud.portal.selection import memberships_and_selected
from spurcloud.tenants.models import Membership

if TYPE_CHECKING:
    from django.contrib.auth.models import User

_P = ParamSpec("_P")


class AuthenticatedHttpRequest(HttpRequest):
    """A request that `login_required` let through: its user is signed in. Under
    `with_membership` it also carries the membership chosen and all the user's (the
    template context reads them)."""

    user: User
    spur_membership: Membership
    spur_memberships: list[Membership]


def with_membership(
    view: Callable[Concatenate[AuthenticatedHttpRequest, Membership, _P], HttpResponseBase],
) -> Callable[Concatenate[AuthenticatedHttpRequest, _P], HttpResponseBase]:
    """Logged in, and a member of some organisation (else: create one first)."""

    @login_required
    @wraps(view)
    def wrapper(
        request: AuthenticatedHttpRequest, /, *args: _P.args, **kwargs: _P.kwargs
    ) -> HttpResponseBase:
        memberships, membership = memberships_and_selected(
            user=request.user, session=request.session
        )
        if membership is None:
            return redirect("portal:organization-create")
        request.spur_membership = membership
        request.spur_memberships = memberships
        return view(request, membership, *args, **kwargs)

    return wrapper
