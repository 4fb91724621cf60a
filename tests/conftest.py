import logging

# Handlers that logging configuration (Django's LOGGING, a command's basicConfig) bound
# to the stream pytest was capturing outlive it: a thread of a live server that logs
# after that capture closed would print "--- Logging error ---" into the next test's
# captured stderr, which the CLI tests compare byte for byte. The logging system's own
# errors are not what any test checks.
logging.raiseExceptions = False

pytest_plugins = ["tests.fixtures.controller"]
