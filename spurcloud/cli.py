"""`spurcloud`: the web server, Django's management commands, and the whole stack.

spurcloud web [--host H] [--port P]   uvicorn on spurcloud.asgi:application
spurcloud manage <command> ...        Django's manage.py
spurcloud up ...                      the whole platform on this host (spurcloud.stack)
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

DEFAULT_SETTINGS = "spurcloud.settings"


def manage(argv: Sequence[str]) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", DEFAULT_SETTINGS)
    from django.core.management import execute_from_command_line

    execute_from_command_line(["spurcloud manage", *argv])
    return 0


def web(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="spurcloud web", description="Run the web app.")
    parser.add_argument("--host", default=os.environ.get("SPUR_WEB_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("SPUR_WEB_PORT", "8000")))
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", DEFAULT_SETTINGS)
    if args.workers > 1 and not _cache_is_shared():
        print(
            "spurcloud web: several web processes (--workers) need a cache they share "
            "(the API's rate limits count there): set CACHE_URL or REDIS_URL to a Redis",
            file=sys.stderr,
        )
        return 2
    import uvicorn

    # The access log: written by the application itself, one write a line, in uvicorn's
    # words (spurcloud/asgi_http.py `AccessLog`), wherever uvicorn would have written it.
    if _level(args.log_level) <= _level("info"):
        os.environ["SPUR_ACCESS_LOG"] = "1"
    uvicorn.run(
        "spurcloud.asgi:application",
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level=args.log_level,
        # Channels' router knows http and websocket only; it has nothing to do at lifespan.
        lifespan="off",
        proxy_headers=True,
        access_log=False,
    )
    return 0


# uvicorn's log levels (`--log-level`), by name.
_LEVELS = {"critical": 50, "error": 40, "warning": 30, "info": 20, "debug": 10, "trace": 5}


def _level(name: str) -> int:
    return _LEVELS.get(name.lower(), 20)


def _cache_is_shared() -> bool:
    """Whether the web processes share the cache (Redis), or each keeps its own (the
    embedded platform's memory cache: one web process). Websockets need no such care:
    with the in-memory channel layer each process polls the jobs table for its own
    sockets (portal/job_feed.py)."""
    from django.conf import settings

    return not str(settings.CACHES["default"]["BACKEND"]).endswith("LocMemCache")


def up(argv: Sequence[str]) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", DEFAULT_SETTINGS)
    from spurcloud import stack  # written apart; imported only when asked for

    return int(stack.main(list(argv)) or 0)


COMMANDS = {"web": web, "manage": manage, "up": up}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    usage = (__doc__ or "").strip()
    if args and args[0] in ("-h", "--help"):
        print(usage)
        return 0
    if not args or args[0] not in COMMANDS:
        print(usage, file=sys.stderr)
        return 2
    return COMMANDS[args[0]](args[1:])


if __name__ == "__main__":
    sys.exit(main())
