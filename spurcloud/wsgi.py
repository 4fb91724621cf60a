"""WSGI entry point, for servers without websockets (the portal then falls back to reload)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "spurcloud.settings")

application = get_wsgi_application()
