"""The Content-Security-Policy of every answer.

No page of the site (the portal, allauth's pages, the admin, the API docs) runs an
inline script or style: scripts and stylesheets are files from this origin (static/, and
the Swagger UI from drf-spectacular-sidecar, with its start-up script served apart by
SpectacularSwaggerSplitView), so the policy allows this origin and nothing inline. A
script that an attacker gets into a page (a job name the templates forgot to escape)
does not run. `data:` images are the Swagger UI stylesheet's icons. 'self' covers the
live table's websocket (ws: and wss: to this host, in CSP level 3).

A few lines rather than django-csp: with nothing inline there are no nonces to make and
no per-view policies to keep, which is what that library is for. Django 6 has this
middleware built in (SECURE_CSP); it replaces this one on the upgrade.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.utils.deprecation import MiddlewareMixin

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "font-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)

# The session page's: xterm.js sizes its rows and cells with <style> elements it writes
# (there is no nonce to give it), so that page allows inline styles; scripts stay 'self'.
TERMINAL_PAGE_POLICY = CONTENT_SECURITY_POLICY.replace(
    "style-src 'self'", "style-src 'self' 'unsafe-inline'"
)


# MiddlewareMixin, sync and async alike. The web runs the chain sync, in the request's one
# thread hop (spurcloud/asgi_http.py): run async, each of its hooks would be a hop of its own.
class ContentSecurityPolicyMiddleware(MiddlewareMixin):
    def process_response(self, request: HttpRequest, response: HttpResponse) -> HttpResponse:
        response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        return response
