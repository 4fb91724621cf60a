"""The admin's sign-in, rate-limited as the portal's is.

allauth limits failed sign-ins to the portal (ACCOUNT_RATE_LIMITS["login_failed"]: per
client address, and per account); Django's admin has no limit of its own. This view
stands in front of `admin.site.login` (spurcloud/urls.py routes /admin/login/ to it) and
counts the admin's failed attempts against the same limits, with the same per-address
counter: splitting guesses between the two forms gains nothing. Over the limit it
answers 429 without trying the password. Only failures count, as in allauth: an
operator who signs in is never locked out by their own sign-ins.
"""

from __future__ import annotations

from typing import Any

from allauth.core import ratelimit
from django.contrib import admin
from django.http import HttpRequest, HttpResponse

ACTION = "login_failed"


def _key(username: str) -> str:
    # Its own namespace: the portal's keys are "<site>:<email>".
    return f"admin:{username.strip().lower()}"


def admin_login(request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
    if request.method != "POST":
        return admin.site.login(request, extra_context)
    username = str(request.POST.get("username", ""))
    if not ratelimit.consume(request, action=ACTION, key=_key(username), dry_run=True):
        response: HttpResponse = ratelimit.respond_429(request)
        return response
    response = admin.site.login(request, extra_context)
    user = request.user
    if not (user.is_authenticated and user.get_username() == username):
        ratelimit.consume(request, action=ACTION, key=_key(username))
    return response
