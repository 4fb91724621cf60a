import logging

# Handlers that logging configuration (Django's LOGGING, a command's basicConfig) bound
# to the stream pytest was capturing outlive it: a thread of a live server that logs
# after that capture closed would print "--- Logging error ---" into the next test's
# captured stderr, which the CLI tests compare byte for byte. The logging system's own
# errors are not what any test checks.
logging.raiseExceptions = False

pytest_plugins = ["tests.fixtures.controller"]


def pytest_configure(config: object) -> None:
    # Users made by fixtures hash their password with Django's default (PBKDF2, a million
    # rounds, about half a second here): a fixture making five people a test would make
    # the suite spend most of its time hashing. The live platforms that tests start run
    # in processes of their own, with the real hashers.
    from django.conf import settings

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
