"""Test-wide settings. Tests run on PostgreSQL, as production does: DATABASE_URL when set,
else the local server (pytest-django creates and drops `test_<name>`)."""

import os

import dj_database_url
from django.conf import settings

pytest_plugins = ["tests.fixtures.controller"]

_url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")
# pytest-django loads the settings before this file, so the database is swapped in place,
# before any connection exists.
settings.DATABASES["default"].clear()
settings.DATABASES["default"].update(dj_database_url.parse(_url))

pytest_plugins = ["tests.fixtures.controller"]
