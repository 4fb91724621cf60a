#!/usr/bin/env python
"""Django's command-line utility (the same as `spurcloud manage ...`)."""

import sys

from spurcloud.cli import manage

if __name__ == "__main__":
    sys.exit(manage(sys.argv[1:]))
