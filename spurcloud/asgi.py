"""The ASGI application `spurcloud web` serves: HTTP through Django (whitenoise serves the
static files from its middleware), each request's Django code in one hop to a thread kept
between requests (spurcloud/asgi_http.py); websockets through Channels with the session
user."""

from __future__ import annotations

import gc
import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "spurcloud.settings")

# Django must be set up before anything imports models (the consumers do).
django.setup(set_prefix=False)

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from spurcloud.asgi_http import http_application  # noqa: E402
from spurcloud.portal.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        # `spurcloud web` turns uvicorn's access log off and asks for this one instead.
        "http": http_application(access_log=os.environ.get("SPUR_ACCESS_LOG") == "1"),
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)

# What exists now (Django, the apps, their modules: ~110,000 objects) lives as long as the
# process. Frozen, the collector's full passes skip it: each scanned it all with every
# request's thread held, ~100 ms of CPU a pass (five passes in bench/portal.py's pages),
# against 20-50 ms for what is made later.
gc.freeze()
